"""The gateway's HTTP/1.1 client to its replicas: kept-alive connections, one write per request.

Forwarding is the gateway's hot path, and a general client costs more there than the rest of the
gateway's work together: httpx's layers (URL merging, cookies, auth and redirect handling, its
response model) and httpcore's (anyio, h11's event machinery) spent about twice the CPU of the
gateway's own checks per request, and h11 sends a request's headers and body as two writes, which
wakes the replica's server twice. This client does only what forwarding needs: a POST with a
known body, written in one piece on a connection kept from an earlier request, and the answer
read back as it arrives.

The answer is parsed by llhttp (through ``httptools``, the parser uvicorn serves with): each
connection is an asyncio protocol that feeds the bytes it receives straight into its parser, whose
callbacks collect the status, the headers and the body. llhttp decides the framing (content-length,
chunks, the end of the connection) and refuses what HTTP/1.1 does not allow — a garbled status
line, folded or malformed headers, conflicting lengths, a chunk size that is not hex. What llhttp
leaves to its user is bounded here: the size of the status line and headers (``MAX_HEAD``), the
body waiting for a slow reader (``BUFFER_HIGH``: reading pauses past it), the time the replica may
stay silent (the client's read timeout), and bytes no request asked for (after an answer's end, or
on an idle connection), which mean the connection cannot carry another request.

Every failure of a connection or of an exchange raises ``UpstreamError``; ``proxy.py`` decides
what it means (another replica, or an error event when bytes already reached the client). A
connection taken from the idle ones that turns out closed by the replica before it answered (its
keep-alive ran out meanwhile) is replaced by a fresh one once: the replica never saw the request.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import httptools

# The status line and headers of an answer (interim 1xx answers included) may take this many
# bytes: llhttp sets no bound of its own, and a replica that never ends its headers must not grow
# the gateway's memory until the read timeout.
MAX_HEAD = 65536
# Body bytes received and not yet taken by the answer's reader: past this, the connection stops
# reading until the reader catches up (a slow client of a streamed answer).
BUFFER_HIGH = 1 << 20


class UpstreamError(Exception):
    """A replica could not be reached, or broke off or garbled its answer."""


@dataclass(frozen=True)
class Origin:
    """Where a replica listens: one pool of idle connections per origin."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"replica URL {url!r}: must be http:// or https:// with a host")
        return cls(parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


class Connection(asyncio.Protocol):
    """One connection to a replica and the answer being read on it.

    ``begin`` sets a fresh parser before each request; between exchanges (idle) there is none,
    and any byte that arrives then closes the connection.
    """

    transport: asyncio.Transport

    def __init__(self) -> None:
        self.idle_since = 0.0
        self.reused = False
        self.lost = False  # closed by either side: never taken again
        self._parser: httptools.HttpResponseParser | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._begin_answer()

    def _begin_answer(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.keep = False  # llhttp's word: the connection may carry another request afterwards
        self.head_done = False
        self.complete = False
        self.error: Exception | None = None
        self.body: list[bytes] = []
        self.buffered = 0
        self._body_bytes = 0
        self._received = 0  # bytes fed to the parser for this answer
        self._head_bytes = 0  # the headers' bytes so far (interim answers' included)
        self._interim = False  # a 1xx answer is being read: the final one follows it
        self._framed = False  # a content-length or a transfer-encoding: not ended by EOF
        self._refused: str | None = None  # why a callback stopped the parser

    # -- the exchange's side ----------------------------------------------------------------------

    def begin(self) -> None:
        """Ready for the answer to the request about to be written."""
        self._begin_answer()
        self._parser = httptools.HttpResponseParser(self)

    def rest(self) -> None:
        """Between exchanges: no answer is expected."""
        self._parser = None
        self.idle_since = time.monotonic()

    def usable(self, now: float, keepalive_s: float) -> bool:
        return now - self.idle_since < keepalive_s and not self.lost and not self.transport.is_closing()

    def close(self) -> None:
        self.lost = True
        self._parser = None
        self.transport.close()

    async def wait(self) -> None:
        """Until more of the answer, its end or a failure arrives (the caller bounds the time)."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def take_body(self) -> bytes:
        """The body bytes received since the last call, in one piece."""
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body.clear()
        self.buffered = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return data

    # -- asyncio's side ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not derive from asyncio.Transport, hence no check).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or self.error is not None:
            # Nothing was asked, or the answer already failed: the replica and the gateway no
            # longer agree where an answer starts, so the connection can carry nothing more.
            self._fail("the replica sent bytes no request asked for")
            return
        self._received += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the replica switched protocols, which no request asked for")
            return
        except httptools.HttpParserError as exc:
            self._fail(self._refused or f"the replica's answer is not valid HTTP/1.1: {exc}")
            return
        if not self.head_done and self._received > MAX_HEAD:
            self._fail(f"the replica's status line and headers exceed {MAX_HEAD} bytes")
            return
        if self.buffered > BUFFER_HIGH and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._parser is not None and self.error is None and not self.complete:
            if self.head_done and not self._framed:
                self.complete = True  # an answer without length or chunks ends with the connection
            elif self._received == 0 and self.reused:
                self.error = _ClosedBeforeAnswer("the replica closed the connection before answering")
            elif self.head_done:
                self.error = UpstreamError(
                    f"the replica closed the connection short of its answer's end ({self._body_bytes} body bytes read)"
                )
            else:
                self.error = UpstreamError(
                    f"the replica closed the connection before its headers ended ({self._received} bytes read)"
                )
        self._parser = None
        self._wake()

    # -- llhttp's callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self._refused = "the replica sent bytes past the end of its answer"
            raise UpstreamError(self._refused)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a chunked body's trailers: none of them matter here
        # Headers that arrive in one read are all parsed in one feed: bound them as they come.
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD:
            self._refused = f"the replica's status line and headers exceed {MAX_HEAD} bytes"
            raise UpstreamError(self._refused)
        key = name.decode("latin-1").lower()
        if key in ("content-length", "transfer-encoding"):
            self._framed = True
        self.headers.append((key, value.decode("latin-1").strip(" \t")))  # llhttp keeps trailing OWS

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        status = self._parser.get_status_code()
        if status == 101:
            self._refused = "the replica switched protocols, which no request asked for"
            raise UpstreamError(self._refused)
        if status < 200:
            # 100 Continue, 103 Early Hints: a final answer follows on the same connection.
            self._interim = True
            self.headers = []
            self._framed = False
            return
        self.status = status
        self.keep = self._parser.should_keep_alive()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        self._body_bytes += len(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True

    # -- within ----------------------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        if self.error is None and self._parser is not None:
            self.error = UpstreamError(why)
        self.lost = True
        self._parser = None
        self.transport.abort()  # what is still buffered either way is wrong: drop it
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


@dataclass
class Answer:
    """A replica's answer: status and headers at once, the body read by ``read`` or ``stream``.

    The connection goes back to the idle ones once the body has been read to its end; ``aclose``
    before that closes it instead (a client that left mid-stream).
    """

    status: int
    headers: list[tuple[str, str]]  # names in lower case, in the replica's order
    _client: Upstream
    _origin: Origin
    _connection: Connection | None
    _read_timeout_s: float
    _done: bool = field(default=False)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream()])

    async def stream(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrived in (each read's worth: a chunk, or several that came
        together). A failure raises ``UpstreamError`` after the pieces that arrived before it."""
        connection = self._connection
        if connection is None:
            return
        timeout = self._read_timeout_s
        while True:
            if connection.body:
                yield connection.take_body()
                continue
            if connection.error is not None:
                self._release()
                raise UpstreamError(str(connection.error))
            if connection.complete:
                break
            try:
                async with asyncio.timeout(timeout):
                    await connection.wait()
            except TimeoutError:
                self._release()
                raise UpstreamError(f"timed out: the replica sent nothing for {timeout:g} s") from None
        self._done = True
        self._release()

    async def events(self) -> AsyncIterator[list[bytes]]:
        """The body as server-sent events, each with its blank-line terminator, in the batches that
        completed together (those one read of the replica's answer finished)."""
        buffer = b""
        async for chunk in self.stream():
            buffer += chunk.replace(b"\r\n", b"\n")
            *complete, buffer = buffer.split(b"\n\n")
            if complete:
                yield [event + b"\n\n" for event in complete]
        if buffer.strip():
            yield [buffer]

    async def aclose(self) -> None:
        self._release()

    def interrupt(self, why: str) -> None:
        """Break the answer off now: its reader gets ``UpstreamError(why)`` (a replica that goes
        away: what it was still sending is not waited for)."""
        connection = self._connection
        if connection is not None:
            connection._fail(why)

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._done and connection.keep:
            self._client._give_back(self._origin, connection)
        else:
            connection.close()


class Upstream:
    """Connections to the replicas, kept alive between requests (idle ones for ``keepalive_s``:
    under the runtimes' own keep-alive bound, so the gateway lets go first)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float = 5.0,
        max_idle_per_origin: int = 512,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self.max_idle_per_origin = max_idle_per_origin
        self._idle: dict[Origin, deque[Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Answer:
        """POST ``body`` to ``url`` (``scheme://host:port/path``) with ``headers`` (the Host
        header among them); the answer's status and headers are in when this returns."""
        parts = urlsplit(url)
        origin = Origin.of(url)
        head = [f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        head.append(f"content-length: {len(body)}\r\n\r\n")
        request = "".join(head).encode("latin-1") + body
        connection = self._take(origin)
        if connection is not None:
            try:
                return await self._exchange(origin, connection, request)
            except _ClosedBeforeAnswer:
                pass  # the replica let the idle connection go: the request never reached it
        connection = await self._connect(origin)
        try:
            return await self._exchange(origin, connection, request)
        except _ClosedBeforeAnswer as exc:
            raise UpstreamError(str(exc)) from None

    async def aclose(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    async def __aenter__(self) -> Upstream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def idle(self, url: str) -> int:
        """How many kept-alive connections to ``url``'s origin wait for a request."""
        return len(self._idle.get(Origin.of(url), ()))

    def _take(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to have timed out
            if connection.usable(now, self.keepalive_s):
                connection.reused = True
                return connection
            connection.close()
        return None

    def _give_back(self, origin: Origin, connection: Connection) -> None:
        idle = self._idle.setdefault(origin, deque())
        if len(idle) >= self.max_idle_per_origin or connection.lost or connection.transport.is_closing():
            connection.close()
            return
        connection.rest()
        idle.append(connection)

    async def _connect(self, origin: Origin) -> Connection:
        tls = None
        if origin.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                # asyncio sets TCP_NODELAY on the connection: each write leaves at once.
                _, connection = await loop.create_connection(Connection, origin.host, origin.port, ssl=tls)
        except TimeoutError:
            raise UpstreamError(f"cannot connect to {origin.host}:{origin.port}: timed out") from None
        except OSError as exc:
            raise UpstreamError(
                f"cannot connect to {origin.host}:{origin.port}: {type(exc).__name__}: {exc}"
            ) from exc
        return connection

    async def _exchange(self, origin: Origin, connection: Connection, request: bytes) -> Answer:
        if connection.lost:
            # Taken and checked a moment ago with no await between: only a replica that closed it
            # in that moment gets here, and it never saw the request.
            raise _ClosedBeforeAnswer("the replica closed the connection before answering")
        connection.begin()
        connection.transport.write(request)
        try:
            async with asyncio.timeout(self.read_timeout_s):
                while not connection.head_done and connection.error is None:
                    await connection.wait()
        except TimeoutError:
            connection.close()
            raise UpstreamError(
                f"timed out: no status line and headers within {self.read_timeout_s:g} s"
            ) from None
        if connection.error is not None:
            connection.close()
            if isinstance(connection.error, _ClosedBeforeAnswer):
                raise connection.error
            raise UpstreamError(str(connection.error))
        return Answer(connection.status, connection.headers, self, origin, connection, self.read_timeout_s)


class _ClosedBeforeAnswer(Exception):
    pass
