"""The gateway's HTTP/1.1 client to its replicas: kept-alive connections, one write per request.

Forwarding is the gateway's hot path, and a general client costs more there than the rest of the
gateway's work together: httpx's layers (URL merging, cookies, auth and redirect handling, its
response model) and httpcore's (anyio, h11's event machinery) spent about twice the CPU of the
gateway's own checks per request, and h11 sends a request's headers and body as two writes, which
wakes the replica's server twice. This client does only what forwarding needs: a POST with a
known body, written in one piece on a connection kept from an earlier request, and the answer
read back by its ``content-length``, its chunks, or to the end of the connection.

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
from urllib.parse import urlsplit

# A chunk of a streamed or long answer is read in pieces of at most this many bytes.
READ_SIZE = 65536


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


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0
        self.reused = False

    def usable(self, now: float, keepalive_s: float) -> bool:
        return (
            now - self.idle_since < keepalive_s and not self.reader.at_eof() and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


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
    _length: int | None  # content-length; None: chunked or to the end of the connection
    _chunked: bool
    _keep: bool  # whether the connection may carry another request once the body is read
    _read_timeout_s: float
    _done: bool = field(default=False)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.stream()])

    async def stream(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        reader, timeout = connection.reader, self._read_timeout_s
        try:
            if self._chunked:
                while True:
                    async with asyncio.timeout(timeout):
                        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                        if size == 0:
                            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                                pass  # trailers: none of them matter here
                            break
                        data = await reader.readexactly(size)
                        await reader.readexactly(2)
                    yield data
            elif self._length is not None:
                left = self._length
                while left:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(min(left, READ_SIZE))
                    if not data:
                        raise UpstreamError(
                            f"the replica closed the connection {left} bytes short of its answer"
                        )
                    left -= len(data)
                    yield data
            else:
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(READ_SIZE)
                    if not data:
                        break
                    yield data
        except (
            OSError,
            TimeoutError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as exc:
            raise UpstreamError(_describe(exc)) from exc
        self._done = True
        self._release()

    async def aclose(self) -> None:
        self._release()

    def _release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._done and self._keep:
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
        if len(idle) >= self.max_idle_per_origin or connection.writer.is_closing():
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def _connect(self, origin: Origin) -> Connection:
        tls = None
        if origin.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                # asyncio sets TCP_NODELAY on the connection: each write leaves at once.
                reader, writer = await asyncio.open_connection(origin.host, origin.port, ssl=tls)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {origin.host}:{origin.port}: {_describe(exc)}") from exc
        return Connection(reader, writer)

    async def _exchange(self, origin: Origin, connection: Connection, request: bytes) -> Answer:
        reader, writer = connection.reader, connection.writer
        try:
            async with asyncio.timeout(self.read_timeout_s):
                writer.write(request)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            connection.close()
            if connection.reused and not exc.partial:
                raise _ClosedBeforeAnswer("the replica closed the connection before answering") from exc
            raise UpstreamError(_describe(exc)) from exc
        except (OSError, TimeoutError, asyncio.LimitOverrunError) as exc:
            connection.close()
            if connection.reused and isinstance(exc, ConnectionResetError | BrokenPipeError):
                raise _ClosedBeforeAnswer("the replica closed the connection before answering") from exc
            raise UpstreamError(_describe(exc)) from exc
        try:
            status, headers = _parse_head(head)
        except ValueError as exc:
            connection.close()
            raise UpstreamError(f"the replica's answer is not HTTP/1.1: {exc}") from exc
        values = dict(headers)
        chunked = "chunked" in values.get("transfer-encoding", "").lower()
        length: int | None = None
        if status in (204, 304):
            length = 0
        elif not chunked and "content-length" in values:
            length = int(values["content-length"])
        keep = (
            values.get("connection", "").lower() != "close"
            and (chunked or length is not None)
            and head.startswith(b"HTTP/1.1")
        )
        answer = Answer(status, headers, self, origin, connection, length, chunked, keep, self.read_timeout_s)
        if length == 0:
            answer._done = True
            answer._release()
        return answer


class _ClosedBeforeAnswer(Exception):
    pass


def _parse_head(head: bytes) -> tuple[int, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"status line {lines[0][:80]!r}")
    status = int(rest[:3])
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"header line {line[:80]!r}")
        headers.append((name.strip().lower(), value.strip()))
    content_length = [v for n, v in headers if n == "content-length"]
    if content_length and (len(set(content_length)) > 1 or not content_length[0].isdigit()):
        raise ValueError(f"content-length {content_length!r}")
    return status, headers


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, asyncio.IncompleteReadError):
        return f"the replica closed the connection mid-answer ({len(exc.partial)} bytes of a part read)"
    return f"{type(exc).__name__}: {exc}"
