"""Migration of in-flight generations through the gateway, with real runtime processes of the tiny
model: a replica killed (kill -9) under 30 streaming greedy clients fails none of them and every
output equals the same request uninterrupted; a stream whose replica breaks off moves on with no
error event and no repeated text, also before its first token and for a non-streamed request; a
request out of migrations ends with an error event that says so; a stream whose pool has no replica
left waits in the pool's hold queue while another starts, up to the hold's timeout.

Where a replica must fail at a chosen point, a real TCP relay stands between the gateway and a real
runtime (``Relay``): it forwards the runtime's bytes until a number of events, holds the rest, and
resets both connections when told — what a replica's death looks like from the gateway. It also
answers the readiness probe itself, so a test decides when the gateway may pick a replica.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from frontier_hostside import names

from tests.gateway.harness import (
    RunningGateway,
    RuntimeProcess,
    free_port,
    gateway_config,
    running_gateway,
    start_runtime,
    tenant,
    wait_ready,
)

pytestmark = pytest.mark.slow

KEY = "sk-acme-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "tiny-a"


# -- a real relay that can kill the connection it carries -----------------------------------------


class Relay:
    """A replica as the gateway sees it: forwards POSTs to ``target`` (a real runtime), answers the
    readiness probe by ``ready``, holds the answer back after ``hold_after`` data events per
    connection, and ``cut()`` resets every connection it carries."""

    def __init__(self, target: str, hold_after: int | None = None) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.hold_after = hold_after
        self.ready = True
        self.events = 0  # data events forwarded, all connections
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.getsockname()[1]}"

    def cut(self) -> None:
        """Reset every connection now: the replica died."""
        self.ready = False
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # shutdown first: a thread blocked reading the socket would keep it open past close().
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        first = client.recv(65536)
        if first.startswith(b"GET "):
            status = b"200 OK" if self.ready else b"503 Service Unavailable"
            client.sendall(b"HTTP/1.1 " + status + b"\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            client.close()
            return
        upstream = socket.create_connection(self.target)
        with self._lock:
            self._socks += [client, upstream]
        upstream.sendall(first)
        threading.Thread(target=self._pump_requests, args=(client, upstream), daemon=True).start()
        buffer = b""
        held = 0
        try:
            while data := upstream.recv(65536):
                buffer += data
                *complete, buffer = buffer.split(b"\n\n")
                for segment in complete:
                    if self.hold_after is not None and held >= self.hold_after:
                        continue  # held back: the gateway sees nothing more from this replica
                    if b"data:" in segment:
                        held += 1
                        self.events += 1
                    client.sendall(segment + b"\n\n")
                if self.hold_after is None or held < self.hold_after:
                    client.sendall(buffer)
                    buffer = b""
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()

    @staticmethod
    def _pump_requests(client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)


# -- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_replicas(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[RuntimeProcess]]:
    """Three real runtime processes of the tiny model."""
    work = tmp_path_factory.mktemp("migration-runtimes")
    procs = [start_runtime(MODEL, tiny_models[MODEL], work) for _ in range(3)]
    try:
        wait_ready(procs)
        yield procs
    finally:
        for proc in procs:
            proc.kill()


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    made: list[Relay] = []
    yield made
    for relay in made:
        relay.close()


def _config(urls: list[str], metering: Path, **extra: Any):
    return gateway_config(
        {MODEL: urls}, [tenant("acme", KEY, [MODEL])], metering, affinity={"mode": "off"}, **extra
    )


@dataclass
class Streamed:
    status: int = 0
    replica: str = ""
    text: str = ""
    events: list[dict] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    error: str | None = None
    done: bool = False  # [DONE] arrived


def _stream(url: str, path: str, body: dict, into: Streamed) -> Streamed:
    try:
        with httpx.stream("POST", url + path, json={**body, "stream": True}, headers=AUTH, timeout=120) as r:
            into.status = r.status_code
            into.replica = r.headers.get(names.REPLICA_HEADER, "")
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    into.done = True
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                into.events.append(event)
                into.arrivals.append(time.monotonic())
                for choice in event.get("choices") or ():
                    into.text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    except httpx.HTTPError as exc:
        into.error = repr(exc)
    return into


def _metric(gw: RunningGateway, name: str) -> float:
    return _scraped(gw.admin_url, name)


def _scraped(url: str, name: str) -> float:
    """The sum of the series ``name`` on the /metrics page of ``url``, over its labels."""
    text = httpx.get(url + names.METRICS_PATH, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def _until(predicate, timeout_s: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _replica_ready(gw: RunningGateway, url: str) -> bool:
    return any(r.url == url and r.ready for r in gw.gateway.pools.get(MODEL).replicas)


def _moved_by_hand(
    gw: RunningGateway, first: Relay, second: Relay, path: str, body: dict, stream: bool
) -> tuple[Streamed, httpx.Response | None]:
    """Send one request while only ``first`` is ready; once ``first`` held its events back, let
    ``second`` in and kill ``first``."""
    result = Streamed()
    answer: list[httpx.Response] = []
    if stream:
        worker = threading.Thread(target=_stream, args=(gw.url, path, body, result))
    else:
        worker = threading.Thread(
            target=lambda: answer.append(httpx.post(gw.url + path, json=body, headers=AUTH, timeout=120))
        )
    worker.start()
    assert first.hold_after is not None
    _until(lambda: first.events >= first.hold_after)
    second.ready = True
    _until(lambda: _replica_ready(gw, second.url))
    first.cut()
    worker.join(120)
    return result, (answer[0] if answer else None)


# -- the drill --------------------------------------------------------------------------------------


def test_kill_9_of_a_replica_under_30_greedy_streams_fails_none_and_every_output_equals_the_uninterrupted_one(
    three_replicas: list[RuntimeProcess], tmp_path: Path
) -> None:
    bodies = [
        {
            "model": MODEL,
            "prompt": f"stream {i} of the drill: tell a long story",
            "max_tokens": 256,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(30)
    ]
    with running_gateway(_config([rt.url for rt in three_replicas], tmp_path / "m.jsonl")) as gw:
        # The same requests uninterrupted, a few at a time so no replica is lost meanwhile.
        reference = []
        for start in range(0, 30, 6):
            batch = [Streamed() for _ in range(6)]
            threads = [
                threading.Thread(target=_stream, args=(gw.url, names.COMPLETIONS_PATH, b, s))
                for b, s in zip(bodies[start : start + 6], batch, strict=True)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            reference += batch
        assert all(r.error is None and r.status == 200 and len(r.events) >= 256 for r in reference)

        results = [Streamed() for _ in bodies]
        threads = [
            threading.Thread(target=_stream, args=(gw.url, names.COMPLETIONS_PATH, b, s))
            for b, s in zip(bodies, results, strict=True)
        ]
        for t in threads:
            t.start()
        ids = {r.id: r.url for r in gw.gateway.pools.get(MODEL).replicas}
        victim = three_replicas[0]
        victim_id = next(i for i, url in ids.items() if url == victim.url)

        # Mid-stream: several of the victim's streams have tokens and are far from their last one,
        # so none of them can finish between the look and the kill.
        def mid_stream() -> list[int]:
            return [i for i, s in enumerate(results) if s.replica == victim_id and 8 <= len(s.events) <= 192]

        # The client's count lags the replica's under load: the victim must itself still be generating
        # (its own running count), or every stream "caught" may already have ended there.
        _until(lambda: len(mid_stream()) >= 6 and _scraped(victim.url, names.RUNNING_METRIC) >= 3)
        caught = mid_stream()
        killed_at = time.monotonic()
        victim.kill()
        for t in threads:
            t.join(180)
        migrations = _metric(gw, names.GATEWAY_MIGRATIONS_METRIC + "_total")
        stalls_counted = _metric(gw, names.GATEWAY_MIGRATION_STALL_METRIC + "_count")

    failed = [
        i for i, s in enumerate(results) if s.error or s.status != 200 or any("error" in e for e in s.events)
    ]
    assert failed == []
    assert [s.text for s in results] == [r.text for r in reference]
    moved_ids = [
        i
        for i, s in enumerate(results)
        if s.replica == victim_id and s.arrivals and s.arrivals[-1] > killed_at
    ]
    moved = [results[i] for i in moved_ids]
    # Every stream caught mid-way ended after the kill; the ones the victim was still generating moved,
    # one migration each (a stream it had finished whose last chunks reached the client late did not).
    assert set(caught) <= set(moved_ids)
    assert 1 <= migrations <= len(moved)
    stalls = []
    for s in moved:
        gaps = [b - a for a, b in zip(s.arrivals, s.arrivals[1:], strict=False) if b > killed_at]
        stalls.append(max(gaps) if gaps else 0.0)
    print(
        f"\nkill -9 drill: 30 streams, {len(moved)} on the killed replica migrated "
        f"({migrations:.0f} migrations counted by the gateway); stall per migrated stream (s): "
        + ", ".join(f"{x:.3f}" for x in sorted(stalls))
    )
    assert stalls_counted == migrations  # the gateway reports each migration's stall


# -- one stream at a time, with a relay that dies on cue ------------------------------------------------


@pytest.fixture(scope="module")
def one_runtime(three_replicas: list[RuntimeProcess]) -> RuntimeProcess:
    return next(rt for rt in three_replicas if rt.process.poll() is None)


def test_a_stream_whose_replica_dies_continues_elsewhere_with_no_error_and_no_repeated_text(
    one_runtime: RuntimeProcess, relays: list[Relay], tmp_path: Path
) -> None:
    body = {"model": MODEL, "prompt": "a stream cut part way", "max_tokens": 64, "temperature": 0}
    whole = _stream(one_runtime.url, names.COMPLETIONS_PATH, body, Streamed())
    first, second = Relay(one_runtime.url, hold_after=10), Relay(one_runtime.url)
    relays += [first, second]
    second.ready = False
    with running_gateway(_config([first.url, second.url], tmp_path / "m.jsonl")) as gw:
        moved, _ = _moved_by_hand(gw, first, second, names.COMPLETIONS_PATH, body, stream=True)
        migrations = _metric(gw, names.GATEWAY_MIGRATIONS_METRIC + "_total")
    assert moved.error is None and not [e for e in moved.events if "error" in e]
    assert moved.text == whole.text
    assert all("token_ids" not in c for e in moved.events for c in e.get("choices") or ())
    assert {e["id"] for e in moved.events} == {moved.events[0]["id"]}
    assert migrations == 1


def test_a_chat_stream_whose_replica_dies_before_its_first_token_continues_elsewhere(
    one_runtime: RuntimeProcess, relays: list[Relay], tmp_path: Path
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 24,
        "temperature": 0,
    }
    whole = _stream(one_runtime.url, names.CHAT_COMPLETIONS_PATH, body, Streamed())
    first, second = Relay(one_runtime.url, hold_after=1), Relay(one_runtime.url)  # the role chunk only
    relays += [first, second]
    second.ready = False
    with running_gateway(_config([first.url, second.url], tmp_path / "m.jsonl")) as gw:
        moved, _ = _moved_by_hand(gw, first, second, names.CHAT_COMPLETIONS_PATH, body, stream=True)
    assert moved.error is None and not [e for e in moved.events if "error" in e]
    assert moved.text == whole.text
    roles = [c["delta"]["role"] for e in moved.events for c in e["choices"] if "role" in c["delta"]]
    assert roles == ["assistant"]  # one opening chunk: the continuation sent none


def test_a_non_streamed_request_whose_replica_dies_is_answered_whole_from_the_next_replica(
    one_runtime: RuntimeProcess, relays: list[Relay], tmp_path: Path
) -> None:
    body = {
        "model": MODEL,
        "prompt": "a non-streamed answer cut part way",
        "max_tokens": 48,
        "temperature": 0,
    }
    whole = httpx.post(one_runtime.url + names.COMPLETIONS_PATH, json=body, timeout=60).json()
    first, second = Relay(one_runtime.url, hold_after=6), Relay(one_runtime.url)
    relays += [first, second]
    second.ready = False
    with running_gateway(_config([first.url, second.url], tmp_path / "m.jsonl")) as gw:
        _, answer = _moved_by_hand(gw, first, second, names.COMPLETIONS_PATH, body, stream=False)
        migrations = _metric(gw, names.GATEWAY_MIGRATIONS_METRIC + "_total")
    assert answer is not None and answer.status_code == 200, answer
    got = answer.json()
    assert answer.headers["content-type"].startswith("application/json")
    assert got["choices"][0]["text"] == whole["choices"][0]["text"]
    assert got["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "length"
    assert got["usage"]["completion_tokens"] == 48 and got["object"] == "text_completion"
    assert migrations == 1


def test_a_replica_interrupted_by_a_notice_moves_its_streams_with_no_error(
    one_runtime: RuntimeProcess, relays: list[Relay], tmp_path: Path
) -> None:
    body = {
        "model": MODEL,
        "prompt": "a stream whose replica got a notice",
        "max_tokens": 40,
        "temperature": 0,
    }
    whole = _stream(one_runtime.url, names.COMPLETIONS_PATH, body, Streamed())
    first, second = Relay(one_runtime.url, hold_after=7), Relay(one_runtime.url)
    relays += [first, second]
    second.ready = False
    with running_gateway(_config([first.url, second.url], tmp_path / "m.jsonl")) as gw:
        result = Streamed()
        worker = threading.Thread(target=_stream, args=(gw.url, names.COMPLETIONS_PATH, body, result))
        worker.start()
        _until(lambda: first.events >= 7)
        second.ready = True
        _until(lambda: _replica_ready(gw, second.url))
        notice = httpx.post(
            gw.admin_url + names.GATEWAY_INTERRUPT_PATH, json={"replica": first.url}, timeout=10
        )
        unknown = httpx.post(
            gw.admin_url + names.GATEWAY_INTERRUPT_PATH, json={"replica": "http://x:1"}, timeout=10
        )
        worker.join(60)
        text = httpx.get(gw.admin_url + names.METRICS_PATH, timeout=10).text
    assert notice.json() == {"replica": first.url, "moved": 1}
    assert unknown.status_code == 404 and "http://x:1" in unknown.json()["error"]
    assert result.error is None and not [e for e in result.events if "error" in e]
    assert result.text == whole.text
    assert f'{names.GATEWAY_MIGRATIONS_METRIC}_total{{model="{MODEL}",reason="interrupted"}} 1.0' in text


def test_a_stream_out_of_migrations_ends_with_an_error_event_naming_the_limit(
    one_runtime: RuntimeProcess, relays: list[Relay], tmp_path: Path
) -> None:
    body = {
        "model": MODEL,
        "prompt": "a stream that keeps losing its replica",
        "max_tokens": 64,
        "temperature": 0,
    }
    first, second = Relay(one_runtime.url, hold_after=4), Relay(one_runtime.url, hold_after=4)
    relays += [first, second]
    second.ready = False
    config = _config([first.url, second.url], tmp_path / "m.jsonl", migration_limit=1)
    with running_gateway(config) as gw:
        result = Streamed()
        worker = threading.Thread(target=_stream, args=(gw.url, names.COMPLETIONS_PATH, body, result))
        worker.start()
        _until(lambda: first.events >= 4)
        second.ready = True
        _until(lambda: _replica_ready(gw, second.url))
        first.cut()
        _until(lambda: second.events >= 4)
        second.cut()
        worker.join(60)
        failures = _metric(gw, names.GATEWAY_MIGRATION_FAILURES_METRIC + "_total")
    errors = [e["error"] for e in result.events if "error" in e]
    assert len(errors) == 1 and result.events[-1].get("error") == errors[0]
    assert errors[0]["code"] == "migration_limit"
    assert "migration limit (1)" in errors[0]["message"]
    assert len(result.events) == 4 + 4 + 1  # what each replica sent, then the error
    assert failures == 1


# -- no replica left: the continuation waits in the hold queue ------------------------------------------


def test_a_stream_whose_only_replica_dies_waits_in_the_hold_queue_while_another_starts_and_ends_equal(
    one_runtime: RuntimeProcess, tiny_models: dict[str, Path], relays: list[Relay], tmp_path: Path
) -> None:
    body = {
        "model": MODEL,
        "prompt": "a stream whose pool lost its only replica",
        "max_tokens": 48,
        "temperature": 0,
    }
    whole = _stream(one_runtime.url, names.COMPLETIONS_PATH, body, Streamed())
    only = Relay(one_runtime.url, hold_after=10)
    relays.append(only)
    # The replica that starts once the only one is gone: the gateway knows its address already,
    # as discovery would list a host that is still booting.
    port = free_port()
    hold = {MODEL: {"max_requests": 8, "timeout_s": 120}}
    config = _config([only.url, f"http://127.0.0.1:{port}"], tmp_path / "m.jsonl", hold=hold)
    started: list[RuntimeProcess] = []
    try:
        with running_gateway(config) as gw:
            _until(lambda: _replica_ready(gw, only.url))
            result = Streamed()
            worker = threading.Thread(target=_stream, args=(gw.url, names.COMPLETIONS_PATH, body, result))
            worker.start()
            _until(lambda: only.events >= 10)
            killed_at = time.monotonic()
            only.cut()
            started.append(start_runtime(MODEL, tiny_models[MODEL], tmp_path / "next", port=port))
            worker.join(120)
            migrations = _metric(gw, names.GATEWAY_MIGRATIONS_METRIC + "_total")
            failures = _metric(gw, names.GATEWAY_MIGRATION_FAILURES_METRIC + "_total")
    finally:
        for runtime in started:
            runtime.kill()
    assert result.error is None and not [e for e in result.events if "error" in e], result.events[-3:]
    assert result.text == whole.text
    assert migrations == 1 and failures == 0
    gaps = [b - a for a, b in zip(result.arrivals, result.arrivals[1:], strict=False) if b > killed_at]
    print(
        f"\nheld while the next replica started: the stream stalled {max(gaps):.2f}s (its start, then the continuation)"
    )
    assert max(gaps) > 0.5  # it waited for the start, not for a replica that was already there


def test_a_stream_with_no_replica_within_the_hold_timeout_ends_with_the_holds_error(
    one_runtime: RuntimeProcess, relays: list[Relay], tmp_path: Path
) -> None:
    body = {"model": MODEL, "prompt": "a stream no replica takes over", "max_tokens": 48, "temperature": 0}
    only = Relay(one_runtime.url, hold_after=6)
    relays.append(only)
    hold = {MODEL: {"max_requests": 8, "timeout_s": 1}}
    with running_gateway(_config([only.url], tmp_path / "m.jsonl", hold=hold)) as gw:
        _until(lambda: _replica_ready(gw, only.url))
        result = Streamed()
        worker = threading.Thread(target=_stream, args=(gw.url, names.COMPLETIONS_PATH, body, result))
        worker.start()
        _until(lambda: only.events >= 6)
        cut_at = time.monotonic()
        only.cut()
        worker.join(60)
        ended_s = result.arrivals[-1] - cut_at
        text = httpx.get(gw.admin_url + names.METRICS_PATH, timeout=10).text
    errors = [e["error"] for e in result.events if "error" in e]
    assert len(errors) == 1 and errors[0]["code"] == "hold_timeout", result.events[-2:]
    assert "gateway.hold.tiny-a.timeout_s" in errors[0]["message"]
    assert 1.0 <= ended_s < 10
    assert (
        f'{names.GATEWAY_MIGRATION_FAILURES_METRIC}_total{{model="{MODEL}",why="hold_timeout"}} 1.0' in text
    )


def test_the_migration_limit_out_of_range_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="migration_limit"):
        _config(["http://127.0.0.1:1"], tmp_path / "m.jsonl", migration_limit=17)
