"""The upstream client against replicas that answer wrongly, over real sockets.

Each replica here is a raw TCP server that sends exactly the bytes a broken or hostile replica
might: truncated chunks, lengths that lie, oversized or folded headers, garbled status lines, a
body that stops. Every such answer ends in ``UpstreamError`` — never a hang (the client's own read
timeout bounds every wait), never a partial or wrong body handed over as a success — and a
connection that carried a broken answer never carries another request, while one that carried a
clean answer does.

Every case runs under both event loops the gateway meets: asyncio's own, and uvloop, which
uvicorn picks in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
import uvloop
from frontier_gateway.upstream import BUFFER_HIGH, MAX_HEAD, Upstream, UpstreamError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

READ_TIMEOUT_S = 0.5
# A stalled replica must be given up on within the read timeout and a little scheduling slack.
GIVE_UP_S = READ_TIMEOUT_S + 1.5
BODY = b'{"id":"cmpl-1","choices":[{"text":"ok"}]}'
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


# -- the replicas ------------------------------------------------------------------------------------


class Replica:
    """A raw TCP server; each connection goes to ``handler(conn, replica)`` in its own thread."""

    def __init__(self, handler: Callable[[socket.socket, Replica], None]) -> None:
        self.handler = handler
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/v1/completions"
        self.connections = 0
        self.stop = threading.Event()  # set at the end: stalled handlers return
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        # OSError: the client gave up on a broken answer and closed, as it should.
        with conn, contextlib.suppress(OSError):
            self.handler(conn, self)

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread at once (Linux)
        for thread in self._threads:
            thread.join(timeout=5)
        self.server.close()


@contextmanager
def replica(handler: Callable[[socket.socket, Replica], None]) -> Iterator[Replica]:
    server = Replica(handler)
    try:
        yield server
    finally:
        server.close()


def read_request(conn: socket.socket) -> bytes | None:
    """One request (its head and its content-length body), or None when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return None
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head


# What a replica does after the bytes of its answer.
CLOSE, STALL = "close", "stall"


def answering(*answers: bytes, then: str = CLOSE) -> Callable[[socket.socket, Replica], None]:
    """Each request on a connection gets the next answer (its bytes in one send); after the last,
    the replica closes the connection or stalls with it open."""

    def handler(conn: socket.socket, server: Replica) -> None:
        for answer in answers:
            if read_request(conn) is None:
                return
            conn.sendall(answer)
        if then == STALL:
            server.stop.wait(30)

    return handler


# -- the client --------------------------------------------------------------------------------------


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run[Any]:
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def run(coro: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)

    return run


def client() -> Upstream:
    return Upstream(connect_timeout_s=2, read_timeout_s=READ_TIMEOUT_S)


async def fetch(upstream: Upstream, url: str) -> tuple[int, list[tuple[str, str]], bytes]:
    answer = await upstream.post(url, {"host": "replica", "content-type": "application/json"}, b"{}")
    try:
        return answer.status, answer.headers, await answer.read()
    finally:
        await answer.aclose()


def outcomes(run: Run[Any], url: str, requests: int = 1) -> list[bytes | UpstreamError]:
    """Each request's body, or the ``UpstreamError`` it raised, over one client."""

    async def go() -> list[bytes | UpstreamError]:
        results: list[bytes | UpstreamError] = []
        async with client() as upstream:
            for _ in range(requests):
                try:
                    results.append((await fetch(upstream, url))[2])
                except UpstreamError as exc:
                    results.append(exc)
        return results

    return run(go())


# -- broken answers: each one an UpstreamError --------------------------------------------------------

BROKEN: dict[str, bytes] = {
    # chunked bodies
    "truncated chunk": CHUNKED_HEAD + b'40\r\ndata: {"id":',
    "no last chunk": CHUNKED_HEAD + b"5\r\nhello\r\n",
    "last chunk without its blank line": CHUNKED_HEAD + b"5\r\nhello\r\n0\r\n",
    "chunk longer than its size": CHUNKED_HEAD + b"2\r\nhello\r\n0\r\n\r\n",
    "chunk size not hex": CHUNKED_HEAD + b"zz\r\nhello\r\n0\r\n\r\n",
    "chunk size with 0x": CHUNKED_HEAD + b"0x5\r\nhello\r\n0\r\n\r\n",
    "negative chunk size": CHUNKED_HEAD + b"-5\r\nhello\r\n0\r\n\r\n",
    "chunk size overflowing 64 bits": CHUNKED_HEAD + b"1ffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    "empty chunk size line": CHUNKED_HEAD + b"\r\nhello\r\n0\r\n\r\n",
    "chunk data without its CRLF": CHUNKED_HEAD + b"5\r\nhelloX\r\n0\r\n\r\n",
    # content-length
    "content-length too long": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + BODY,
    "content-length too short": b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n" + BODY,
    "content-length not a number": b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n" + BODY,
    "negative content-length": b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n" + BODY,
    "two different content-lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: %d\r\n\r\n%s"
    % (len(BODY), BODY),
    "content-length and chunked": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    "204 with a body": b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
    # headers
    "obsolete folded header (space)": b"HTTP/1.1 200 OK\r\nx-note: one\r\n two\r\ncontent-length: %d\r\n\r\n%s"
    % (len(BODY), BODY),
    "obsolete folded header (tab)": b"HTTP/1.1 200 OK\r\nx-note: one\r\n\ttwo\r\ncontent-length: %d\r\n\r\n%s"
    % (len(BODY), BODY),
    "header without a colon": b"HTTP/1.1 200 OK\r\nbogus\r\n" + OK.split(b"\r\n", 1)[1],
    "space before a header's colon": b"HTTP/1.1 200 OK\r\ncontent-length : %d\r\n\r\n%s" % (len(BODY), BODY),
    "NUL in a header value": b"HTTP/1.1 200 OK\r\nx-note: a\x00b\r\n" + OK.split(b"\r\n", 1)[1],
    "bare LF line endings": OK.replace(b"\r\n", b"\n"),
    "oversized header": b"HTTP/1.1 200 OK\r\nx-big: "
    + b"a" * (MAX_HEAD + 1024)
    + b"\r\n"
    + OK.split(b"\r\n", 1)[1],
    "oversized header block": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(MAX_HEAD // 100 + 10))
    + OK.split(b"\r\n", 1)[1],
    # status lines
    "status not a number": b"HTTP/1.1 2x0 OK\r\n" + OK.split(b"\r\n", 1)[1],
    "status of two digits": b"HTTP/1.1 20 OK\r\n" + OK.split(b"\r\n", 1)[1],
    "status of four digits": b"HTTP/1.1 2000 OK\r\n" + OK.split(b"\r\n", 1)[1],
    "no status": b"HTTP/1.1\r\n" + OK.split(b"\r\n", 1)[1],
    "HTTP/2 status line": b"HTTP/2 200\r\n" + OK.split(b"\r\n", 1)[1],
    "lower-case protocol": b"http/1.1 200 OK\r\n" + OK.split(b"\r\n", 1)[1],
    "not HTTP at all": b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    "a TLS record": b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
    "101 switching protocols": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
    # connections that end early
    "closed before any byte": b"",
    "closed mid status line": b"HTTP/1.1 20",
    "closed mid headers": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-le",
    "closed after headers": b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(BODY),
    "closed after a 100 Continue": b"HTTP/1.1 100 Continue\r\n\r\n",
}

# Broken answers after which a replica that keeps the connection open makes no difference: the
# client sees the fault in the bytes themselves, not from the connection's end.
SEEN_IN_THE_BYTES = {
    name
    for name in BROKEN
    if not name.startswith("closed")
    and name
    not in {
        "truncated chunk",
        "no last chunk",
        "last chunk without its blank line",
        "content-length too long",
    }
}


@pytest.mark.parametrize("then", [CLOSE, STALL])
@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_answer_raises_upstream_error_and_never_hangs(run: Run[Any], name: str, then: str) -> None:
    with replica(answering(BROKEN[name], then=then)) as server:
        started = time.monotonic()
        [outcome] = outcomes(run, server.url)
        took = time.monotonic() - started
    assert isinstance(outcome, UpstreamError), f"{name}: delivered {outcome!r} as a success"
    assert took < GIVE_UP_S
    if then == STALL and name in SEEN_IN_THE_BYTES:
        # Refused on sight, not after waiting out the read timeout.
        assert "timed out" not in str(outcome)
        assert took < READ_TIMEOUT_S


def test_an_oversized_header_is_refused_before_it_ends(run: Run[Any]) -> None:
    """A replica whose headers never end is cut off at MAX_HEAD bytes, not buffered until the
    read timeout."""

    def endless(conn: socket.socket, server: Replica) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nx-endless: ")
        while not server.stop.is_set():
            conn.sendall(b"a" * 4096)

    with replica(endless) as server:
        started = time.monotonic()
        [outcome] = outcomes(run, server.url)
        assert isinstance(outcome, UpstreamError)
        assert f"exceed {MAX_HEAD} bytes" in str(outcome)
        assert time.monotonic() - started < READ_TIMEOUT_S


@pytest.mark.parametrize(
    "sent",
    [b"", b"HTTP/1.1 200 OK\r\ncontent-type: app", OK[: OK.index(b"\r\n\r\n") + 4] + BODY[:5]],
    ids=["before any byte", "mid headers", "mid body"],
)
def test_a_replica_that_stalls_times_out(run: Run[Any], sent: bytes) -> None:
    with replica(answering(sent, then=STALL)) as server:
        started = time.monotonic()
        [outcome] = outcomes(run, server.url)
        took = time.monotonic() - started
    assert isinstance(outcome, UpstreamError)
    assert "timed out" in str(outcome)
    assert READ_TIMEOUT_S * 0.9 <= took < GIVE_UP_S


def test_headers_that_trickle_in_forever_time_out(run: Run[Any]) -> None:
    """The status line and headers have one deadline in all, not one per byte."""

    def trickle(conn: socket.socket, server: Replica) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for i in range(1000):
            if server.stop.wait(READ_TIMEOUT_S / 5):
                return
            conn.sendall(b"x-slow-%d: 1\r\n" % i)

    with replica(trickle) as server:
        started = time.monotonic()
        [outcome] = outcomes(run, server.url)
        took = time.monotonic() - started
    assert isinstance(outcome, UpstreamError)
    assert "timed out" in str(outcome)
    assert took < GIVE_UP_S


def test_a_streamed_answer_that_breaks_off_delivers_its_chunks_then_raises(run: Run[Any]) -> None:
    """What already arrived goes on to the client (the proxy then adds an error event); the
    break itself is an UpstreamError, not a quiet end of the stream."""
    sent = CHUNKED_HEAD + b'6\r\ndata: \r\n4\r\n{"id'

    async def go() -> tuple[list[bytes], UpstreamError | None]:
        pieces: list[bytes] = []
        async with client() as upstream:
            answer = await upstream.post(server.url, {"host": "replica"}, b"{}")
            try:
                async for piece in answer.stream():
                    pieces.append(piece)
            except UpstreamError as exc:
                return pieces, exc
            finally:
                await answer.aclose()
        return pieces, None

    with replica(answering(sent)) as server:
        pieces, error = run(go())
    assert error is not None
    assert b"".join(pieces) == b'data: {"id'


# -- answers that are unusual but right -------------------------------------------------------------


@pytest.mark.parametrize(
    "interim",
    [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n"],
    ids=["100", "103"],
)
def test_an_interim_1xx_answer_is_skipped_for_the_final_one(run: Run[Any], interim: bytes) -> None:
    async def go() -> tuple[int, list[tuple[str, str]], bytes]:
        async with client() as upstream:
            return await fetch(upstream, server.url)

    with replica(answering(interim + OK)) as server:
        status, headers, body = run(go())
    assert (status, body) == (200, BODY)
    assert ("link", "</a.css>; rel=preload") not in headers  # the interim answer's headers stay there


def test_chunk_extensions_and_trailers_are_read_past(run: Run[Any]) -> None:
    sent = CHUNKED_HEAD + b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-checksum: abc\r\n\r\n"

    async def go() -> tuple[int, list[tuple[str, str]], bytes]:
        async with client() as upstream:
            return await fetch(upstream, server.url)

    with replica(answering(sent)) as server:
        status, headers, body = run(go())
    assert (status, body) == (200, b"hello world")
    assert [name for name, _ in headers] == ["content-type", "transfer-encoding"]


def test_headers_come_in_order_with_lower_case_names_and_trimmed_values(run: Run[Any]) -> None:
    sent = b"HTTP/1.1 429 Too Many\r\nRetry-After:  3 \r\nX-Request-ID:\tr-1\r\nContent-Length: 2\r\n\r\n{}"

    async def go() -> tuple[int, list[tuple[str, str]], bytes]:
        async with client() as upstream:
            return await fetch(upstream, server.url)

    with replica(answering(sent)) as server:
        assert run(go()) == (
            429,
            [("retry-after", "3"), ("x-request-id", "r-1"), ("content-length", "2")],
            b"{}",
        )


def test_an_answer_without_length_or_chunks_ends_with_the_connection(run: Run[Any]) -> None:
    sent = b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n" + BODY
    with replica(answering(sent)) as server:
        assert outcomes(run, server.url, requests=2) == [BODY, BODY]
    assert server.connections == 2  # such an answer leaves nothing to reuse


def test_a_body_larger_than_the_buffer_reaches_a_slow_reader_whole(run: Run[Any]) -> None:
    """Past BUFFER_HIGH unread bytes the connection pauses reading; it resumes as the reader
    catches up, and no byte is lost or repeated."""
    body = bytes(range(256)) * (3 * BUFFER_HIGH // 256 + 7)
    pieces = [body[i : i + 50_000] for i in range(0, len(body), 50_000)]
    sent = CHUNKED_HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

    async def go() -> bytes:
        received = []
        async with client() as upstream:
            answer = await upstream.post(server.url, {"host": "replica"}, b"{}")
            await asyncio.sleep(0.2)  # everything the socket holds arrives meanwhile
            async for piece in answer.stream():
                received.append(piece)
                await asyncio.sleep(0.005)
            assert upstream.idle(server.url) == 1
        return b"".join(received)

    with replica(answering(sent, then=STALL)) as server:
        assert run(go()) == body


def test_chunks_reach_the_reader_as_they_arrive(run: Run[Any]) -> None:
    """Streaming: each chunk is handed on before the replica has sent the next one."""
    handed_on = threading.Event()

    def two_events(conn: socket.socket, server: Replica) -> None:
        read_request(conn)
        conn.sendall(CHUNKED_HEAD + b"9\r\ndata: 1\n\n\r\n")
        handed_on.wait(5)
        conn.sendall(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")

    async def go() -> list[bytes]:
        pieces = []
        async with client() as upstream:
            answer = await upstream.post(server.url, {"host": "replica"}, b"{}")
            async for piece in answer.stream():
                pieces.append(piece)
                handed_on.set()
        return pieces

    with replica(two_events) as server:
        assert run(go()) == [b"data: 1\n\n", b"data: 2\n\n"]


# -- which connections carry another request ----------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [OK, CHUNKED_HEAD + b"5\r\nhello\r\n0\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n"],
    ids=["content-length", "chunked", "204"],
)
def test_a_connection_is_reused_after_a_clean_answer(run: Run[Any], first: bytes) -> None:
    with replica(answering(first, OK, then=STALL)) as server:
        results = outcomes(run, server.url, requests=2)
    assert results[1] == BODY
    assert not isinstance(results[0], UpstreamError)
    assert server.connections == 1


def test_a_connection_the_replica_asked_to_close_is_not_reused(run: Run[Any]) -> None:
    closing = OK.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
    with replica(answering(closing, OK, then=STALL)) as server:
        assert outcomes(run, server.url, requests=2) == [BODY, BODY]
    assert server.connections == 2


@pytest.mark.parametrize(
    "broken",
    [
        "content-length too short",
        "chunk size not hex",
        "chunk longer than its size",
        "obsolete folded header (space)",
        "101 switching protocols",
        "stalled mid-body",
    ],
)
def test_a_connection_is_not_reused_after_a_broken_answer(run: Run[Any], broken: str) -> None:
    """The second request goes over a fresh connection and gets its answer whole: nothing of the
    broken answer leaks into it."""
    first = BROKEN.get(broken, OK[: OK.index(b"\r\n\r\n") + 4] + BODY[:5])
    served: list[int] = []

    def handler(conn: socket.socket, server: Replica) -> None:
        served.append(1)
        if len(served) == 1:
            answering(first, OK, then=STALL)(conn, server)  # would answer OK next, if asked
        else:
            answering(OK, then=STALL)(conn, server)

    with replica(handler) as server:
        first_outcome, second = outcomes(run, server.url, requests=2)
    assert isinstance(first_outcome, UpstreamError)
    assert second == BODY
    assert server.connections == 2


def test_bytes_on_an_idle_connection_keep_it_from_being_reused(run: Run[Any]) -> None:
    """A replica that sends something after its answer is out of step with the gateway: the next
    request must not read that as its answer."""
    late = b"HTTP/1.1 500 Late\r\ncontent-length: 4\r\n\r\nlate"

    def handler(conn: socket.socket, server: Replica) -> None:
        if server.connections == 1:
            read_request(conn)
            conn.sendall(OK)
            time.sleep(0.05)
            conn.sendall(late)
            server.stop.wait(30)
        else:
            answering(OK, then=STALL)(conn, server)

    async def go() -> list[tuple[int, bytes]]:
        async with client() as upstream:
            first = await fetch(upstream, server.url)
            await asyncio.sleep(0.3)
            second = await fetch(upstream, server.url)
        return [(first[0], first[2]), (second[0], second[2])]

    with replica(handler) as server:
        assert run(go()) == [(200, BODY), (200, BODY)]
    assert server.connections == 2


def test_a_reader_that_leaves_mid_body_does_not_return_the_connection(run: Run[Any]) -> None:
    async def go() -> int:
        async with client() as upstream:
            answer = await upstream.post(server.url, {"host": "replica"}, b"{}")
            stream = answer.stream()
            await anext(stream)
            await answer.aclose()
            return upstream.idle(server.url)

    sent = CHUNKED_HEAD + b"5\r\nhello\r\n"
    with replica(answering(sent, then=STALL)) as server:
        assert run(go()) == 0


def test_the_clients_connections_set_tcp_nodelay(run: Run[Any]) -> None:
    """One write per request only pays off if it leaves at once, under either loop."""

    async def go() -> int:
        async with client() as upstream:
            await fetch(upstream, server.url)
            # The kept-alive connection, taken from the pool as the next request would take it.
            connection = upstream._take(next(iter(upstream._idle)))
            assert connection is not None
            sock = connection.transport.get_extra_info("socket")
            return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    with replica(answering(OK, then=STALL)) as server:
        assert run(go()) == 1


# -- fuzzing ------------------------------------------------------------------------------------------

FUZZ = settings(
    max_examples=80,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
header_names = st.from_regex(rb"\Ax-[a-z0-9-]{1,12}\Z")
header_values = st.from_regex(rb"\A[!-~]([ -~]{0,30}[!-~])?\Z")


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, int, list[tuple[str, str]], bytes, str]:
    """(the bytes on the wire, status, headers, body, flaw): a well-formed answer framed by length
    or by chunks of random sizes, then cut short, followed by bytes past its end, or left whole."""
    status = draw(st.sampled_from([200, 201, 400, 404, 422, 429, 500, 503]))
    headers = draw(st.lists(st.tuples(header_names, header_values), max_size=4))
    body = draw(st.binary(max_size=400))
    head = b"HTTP/1.1 %d Reason\r\n" % status + b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    if draw(st.booleans()):
        framing = [(b"content-length", b"%d" % len(body))]
        wire = head + b"content-length: %d\r\n\r\n" % len(body) + body
    else:
        framing = [(b"transfer-encoding", b"chunked")]
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        wire = head + b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    flaw = draw(st.sampled_from(["none", "cut short", "bytes past its end"]))
    if flaw == "cut short":
        wire = wire[: draw(st.integers(0, len(wire) - 1))]
    elif flaw == "bytes past its end":
        # CR and LF between answers are allowed (and skipped): anything else starts a second answer.
        wire += draw(st.binary(min_size=1, max_size=40).filter(lambda b: b[:1] not in (b"\r", b"\n")))
    names = [(n.decode(), v.decode()) for n, v in headers + framing]
    return wire, status, names, body, flaw


def mutate(wire: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """Each edit (where, how many bytes to drop, what to put there), applied in turn."""
    for where, drop, put in edits:
        at = where % (len(wire) + 1)
        wire = wire[:at] + put + wire[at + drop :]
    return wire


edits = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 8), st.binary(max_size=8)), min_size=1, max_size=4
)


@contextmanager
def one_answer_per_connection() -> Iterator[tuple[str, list[bytes]]]:
    """A replica that answers each connection's request with ``wire[0]`` and closes it."""
    wire = [b""]

    def handler(conn: socket.socket, server: Replica) -> None:
        if read_request(conn) is not None:
            conn.sendall(wire[0])

    with replica(handler) as server:
        yield server.url, wire


async def answer_or_error(url: str) -> tuple[int, list[tuple[str, str]], bytes] | UpstreamError:
    """One request through a fresh client: the answer, or the UpstreamError it raised."""
    async with client() as upstream:
        try:
            return await fetch(upstream, url)
        except UpstreamError as exc:
            return exc


def test_fuzzed_answers_are_whole_or_refused(run: Run[Any]) -> None:
    """A whole answer arrives exactly as sent; one cut short or followed by more bytes is an
    UpstreamError. Nothing else is raised and nothing hangs."""

    with one_answer_per_connection() as (url, wire):

        @FUZZ
        @given(answers())
        def check(answer: tuple[bytes, int, list[tuple[str, str]], bytes, str]) -> None:
            wire[0], status, headers, body, flaw = answer
            outcome = run(answer_or_error(url))
            if flaw == "none":
                assert outcome == (status, headers, body)
            else:
                assert isinstance(outcome, UpstreamError), f"{flaw}: delivered {outcome!r}"

        check()


def test_mutated_answers_end_in_an_answer_or_upstream_error(run: Run[Any]) -> None:
    """Random edits of a well-formed answer (bytes dropped, inserted, replaced): the client
    either reads an answer no longer than what was sent or raises UpstreamError, within its
    timeouts. No other exception escapes."""

    with one_answer_per_connection() as (url, wire):

        @FUZZ
        @given(answers().filter(lambda a: a[4] == "none"), edits)
        def check(answer: tuple[bytes, int, list[tuple[str, str]], bytes, str], edit: list[Any]) -> None:
            wire[0] = mutate(answer[0], edit)
            started = time.monotonic()
            outcome = run(answer_or_error(url))
            assert time.monotonic() - started < GIVE_UP_S
            if not isinstance(outcome, UpstreamError):
                status, _, body = outcome
                assert 0 <= status <= 999
                assert len(body) <= len(wire[0])

        check()
