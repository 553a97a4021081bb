"""``fab batch`` as a tenant through the stack's gateway: a real gateway on real sockets in front of
a scripted runtime stand-in (or, for the kill -9, a real runtime process), ``fab`` run as the
operator runs it. Lines that fail are summarised by reason and line, a rerun resends only what it
is asked to, and a line that succeeded is never sent again — also after the batch is killed
half-way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from frontier.access.usage import read_records
from frontier.targets import backend_for, load_stack
from tests.gateway.harness import (
    RunningGateway,
    gateway_config,
    running_gateway,
    start_runtime,
    tenant,
    wait_ready,
)
from tests.gateway.stacks import two_model_config, write_stack

FAB = str(Path(sys.executable).with_name("fab"))
MODEL = "tiny-llama-small"
KEY = "sk-nightly-0123456789"
# The small pool's shape in the two-model stack (tests/gateway/stacks.py).
SMALL_SHAPE = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 344,
    "max_position_embeddings": 512,
}


class _Scripted(BaseHTTPRequestHandler):
    """A runtime that answers each prompt as scripted (200 by default) and records what it was sent."""

    protocol_version = "HTTP/1.1"
    server: ScriptedRuntime

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # the gateway's readiness probe
        self._json(200, {"ready": True})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.prompts.append(body["prompt"])
        time.sleep(self.server.delay_s)
        status = self.server.script.get(body["prompt"], 200)
        if status != 200:
            self._json(status, {"error": {"message": f"scripted {status}", "type": "scripted", "code": None}})
            return
        usage = {
            "prompt_tokens": 5,
            "completion_tokens": body["max_tokens"],
            "total_tokens": 5 + body["max_tokens"],
        }
        self._json(
            200,
            {"id": "x", "object": "text_completion", "model": body["model"], "choices": [], "usage": usage},
        )

    def _json(self, status: int, obj: dict) -> None:
        payload = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class ScriptedRuntime(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Scripted)
        self.script: dict[str, int] = {}
        self.prompts: list[str] = []
        self.delay_s = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def sent(self) -> Counter[str]:
        with self.lock:
            return Counter(self.prompts)


@dataclass
class Stack:
    """A two-model stack whose gateway (the stack's endpoint) runs in this process, in front of one replica."""

    stacks: Path
    gateway: RunningGateway
    metering: Path
    source: Path
    output: Path
    env: dict[str, str]

    def fab(self, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
        command = [FAB, "batch", "-s", "local", "--model", MODEL, "--input", str(self.source)]
        command += ["--output", str(self.output), "--concurrency", "4", "--attempts", "1", *args]
        if key:
            command += ["--key", key]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=120)

    def results(self) -> list[dict]:
        return [json.loads(line) for line in self.output.read_text().splitlines()]


@dataclass
class Cluster(Stack):
    runtime: ScriptedRuntime


@contextmanager
def gateway_stack(tmp_path: Path, replica: str) -> Iterator[Stack]:
    metering = tmp_path / "metering.jsonl"
    config = gateway_config({MODEL: [replica]}, [tenant("nightly", KEY, [MODEL], priority="batch")], metering)
    with running_gateway(config) as gw:
        document = two_model_config()
        port = int(gw.url.rsplit(":", 1)[1])
        document["config"]["frontier:gateway"] = {"port": port, "metering": {"uri": str(metering)}}
        write_stack(tmp_path / "stacks", document)
        env = {
            **os.environ,
            "FRONTIER_STACKS_DIR": str(tmp_path / "stacks"),
            "FRONTIER_STACK": "",
            "FRONTIER_API_KEY": "",
        }
        yield Stack(
            tmp_path / "stacks", gw, metering, tmp_path / "requests.jsonl", tmp_path / "results.jsonl", env
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    runtime = ScriptedRuntime()
    try:
        with gateway_stack(tmp_path, runtime.url) as stack:
            yield Cluster(**vars(stack), runtime=runtime)
    finally:
        runtime.shutdown()
        runtime.server_close()


def write_input(path: Path, lines: int, malformed: tuple[int, ...] = (), max_tokens: int = 3) -> None:
    rows = []
    for i in range(1, lines + 1):
        if i in malformed:
            rows.append(f'{{"custom_id": "doc-{i}", "method": "POST", "url": "/v1/completions", "body": ')
            continue
        body = {"prompt": f"doc {i}", "max_tokens": max_tokens}
        rows.append(
            json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/completions", "body": body})
        )
    path.write_text("\n".join(rows) + "\n")


def row(stdout: str, label: str) -> str:
    """The summary table's row that starts with ``label``."""
    found = [
        line for line in stdout.splitlines() if line.startswith("│") and line.strip("│ ").startswith(label)
    ]
    assert found, f"no row {label!r} in:\n{stdout}"
    return found[0]


def failing_batch(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """Eight lines: 2 and 5 malformed, 4 refused by the runtime (400), 6 met a busy runtime (503)."""
    write_input(cluster.source, 8, malformed=(2, 5))
    cluster.runtime.script = {"doc 4": 400, "doc 6": 503}
    return cluster.fab()


def test_the_endpoint_of_a_gateway_stack_is_its_gateway_and_it_names_no_key(cluster: Cluster) -> None:
    backend = backend_for(load_stack("local", path=cluster.stacks / "Pulumi.local.yaml"))
    assert backend.endpoint() == cluster.gateway.url
    assert backend.api_key() is None


def test_a_batch_whose_lines_fail_prints_its_summary_by_reason_and_line(cluster: Cluster) -> None:
    done = failing_batch(cluster)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "malformed line 2: not valid JSON" in done.stdout
    assert "malformed line 5: not valid JSON" in done.stdout
    assert "4" in row(done.stdout, "succeeded")
    assert "lines 4" in row(done.stdout, "failed: HTTP 400")
    assert "lines 6" in row(done.stdout, "failed: HTTP 503")
    assert "lines 2, 5" in row(done.stdout, "malformed")
    assert done.stdout.splitlines()[-1] == (
        "batch: lines=8 done_before=0 succeeded=4 failed=2 not_retried=0 malformed=2 results=8"
    )


def test_a_plain_rerun_sends_nothing_and_reports_the_earlier_failures_as_not_done(cluster: Cluster) -> None:
    failing_batch(cluster)
    before = cluster.runtime.sent()
    again = cluster.fab()
    assert cluster.runtime.sent() == before
    assert again.returncode == 1
    assert "--retry-failed resends them" in row(again.stdout, "failed earlier, not resent: HTTP 503")
    assert "--retry-status 400 resends them" in row(again.stdout, "failed earlier, not resent: HTTP 400")
    assert again.stdout.splitlines()[-1] == (
        "batch: lines=8 done_before=4 succeeded=0 failed=0 not_retried=2 malformed=2 results=8"
    )


def test_retry_failed_resends_only_the_lines_a_retry_can_fix(cluster: Cluster) -> None:
    failing_batch(cluster)
    cluster.runtime.script = {"doc 4": 400}  # the runtime is no longer busy
    before = cluster.runtime.sent()
    again = cluster.fab("--retry-failed")
    assert cluster.runtime.sent() - before == Counter({"doc 6": 1})
    assert again.returncode == 1  # line 4's 400 is still there, reported
    results = {r["line"]: r for r in cluster.results()}
    assert len(cluster.results()) == 8  # still one result per line: line 6's 503 was replaced
    assert results[6]["response"]["status_code"] == 200
    assert results[4]["response"]["status_code"] == 400


def test_retry_status_resends_the_client_errors_it_names(cluster: Cluster) -> None:
    failing_batch(cluster)
    cluster.runtime.script = {}
    before = cluster.runtime.sent()
    again = cluster.fab("--retry-status", "400")
    assert cluster.runtime.sent() - before == Counter({"doc 4": 1})  # not the 503: that needs --retry-failed
    assert "lines 6" in row(again.stdout, "failed earlier, not resent: HTTP 503")


def test_a_line_that_succeeded_is_never_sent_again(cluster: Cluster) -> None:
    failing_batch(cluster)
    cluster.runtime.script = {}
    cluster.fab("--retry-failed", "--retry-status", "400")
    final = cluster.fab("--retry-failed", "--retry-status", "400,401,422")
    assert final.returncode == 0, final.stdout + final.stderr
    assert cluster.runtime.sent() == Counter(
        {"doc 1": 1, "doc 3": 1, "doc 4": 2, "doc 6": 2, "doc 7": 1, "doc 8": 1}
    )
    assert sorted(r["line"] for r in cluster.results() if r["response"]) == [1, 3, 4, 6, 7, 8]
    assert all(r["response"]["status_code"] == 200 for r in cluster.results() if r["response"])


def test_a_line_that_timed_out_is_resent_by_retry_failed(cluster: Cluster) -> None:
    write_input(cluster.source, 2)
    cluster.runtime.script = {}
    cluster.runtime.delay_s = 1.5
    slow = cluster.fab("--timeout", "0.5")
    assert "lines 1, 2" in row(slow.stdout, "failed: timeout")
    cluster.runtime.delay_s = 0.0
    again = cluster.fab("--retry-failed")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["response"]["status_code"] for r in cluster.results()] == [200, 200]


def test_a_malformed_line_fixed_in_the_input_is_sent_on_the_next_run(cluster: Cluster) -> None:
    write_input(cluster.source, 3, malformed=(2,))
    cluster.fab()
    write_input(cluster.source, 3)
    again = cluster.fab()
    assert again.returncode == 0, again.stdout + again.stderr
    assert cluster.runtime.sent() == Counter({"doc 1": 1, "doc 2": 1, "doc 3": 1})
    assert sorted(r["line"] for r in cluster.results()) == [1, 2, 3]


def test_the_batch_runs_as_the_tenant_at_batch_priority_and_is_metered(cluster: Cluster) -> None:
    write_input(cluster.source, 6)
    done = cluster.fab()
    assert done.returncode == 0, done.stdout + done.stderr
    records = wait_for_records(cluster.metering, 6)
    assert {(r.tenant, r.model, r.priority, r.status) for r in records} == {("nightly", MODEL, "batch", 200)}
    usage = subprocess.run([FAB, "usage", "-s", "local"], capture_output=True, text=True, env=cluster.env)
    assert usage.returncode == 0, usage.stderr
    nightly = next(line for line in usage.stdout.splitlines() if "nightly" in line)
    assert MODEL in nightly and " 6 " in nightly


def test_a_wrong_key_fails_every_line_with_401_and_is_not_counted_done(cluster: Cluster) -> None:
    write_input(cluster.source, 3)
    done = cluster.fab(key="sk-not-a-tenant")
    assert cluster.runtime.sent() == Counter()  # the gateway refused them; no runtime saw one
    assert "lines 1, 2, 3" in row(done.stdout, "failed: HTTP 401")
    fixed = cluster.fab("--retry-status", "401")
    assert fixed.returncode == 0 and cluster.runtime.sent() == Counter({"doc 1": 1, "doc 2": 1, "doc 3": 1})


def test_a_gateway_stack_without_a_key_is_refused_naming_the_tenants(cluster: Cluster) -> None:
    write_input(cluster.source, 1)
    done = cluster.fab(key=None)
    assert done.returncode == 2
    assert (
        "--key: stack 'local' has a gateway" in done.stderr
        and "may use 'tiny-llama-small': acme, nightly)" in done.stderr
    )
    assert not cluster.output.exists() or cluster.output.read_text() == ""


def test_retry_status_refuses_what_is_not_an_error_status(cluster: Cluster) -> None:
    write_input(cluster.source, 1)
    done = cluster.fab("--retry-status", "401,ok")
    assert done.returncode == 2 and "--retry-status: 'ok' is not an HTTP error status" in done.stderr


@pytest.fixture
def runtime_stack(tmp_path: Path) -> Iterator[Stack]:
    """The same stack in front of a real runtime process serving a tiny model of the small shape."""
    from frontier_runtime.tiny import make_tiny_checkpoint

    model_dir = make_tiny_checkpoint(tmp_path / "model", seed=3, **SMALL_SHAPE)
    runtime = start_runtime(MODEL, model_dir, tmp_path / "runtime")
    try:
        wait_ready([runtime])
        with gateway_stack(tmp_path, runtime.url) as stack:
            yield stack
    finally:
        runtime.kill()


def test_a_batch_killed_half_way_and_rerun_has_one_200_per_valid_line(runtime_stack: Stack) -> None:
    stack, malformed = runtime_stack, (7, 19, 33)
    valid = [i for i in range(1, 41) if i not in malformed]
    write_input(stack.source, 40, malformed=malformed, max_tokens=24)
    command = [FAB, "batch", "-s", "local", "--model", MODEL, "--input", str(stack.source)]
    command += ["--output", str(stack.output), "--concurrency", "2", "--key", KEY]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=stack.env)
    deadline = time.monotonic() + 120
    while not stack.output.exists() or stack.output.read_text().count("\n") < 15:
        assert time.monotonic() < deadline and first.poll() is None, "the batch never got half-way"
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert stack.output.read_text().count("\n") < 40
    second = subprocess.run(command, capture_output=True, text=True, env=stack.env, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    ok = Counter(r["line"] for r in stack.results() if (r["response"] or {}).get("status_code") == 200)
    assert ok == Counter(dict.fromkeys(valid, 1))
    assert sorted(r["line"] for r in stack.results()) == list(range(1, 41))
    assert "lines 7, 19, 33" in row(second.stdout, "malformed")
    assert second.stdout.splitlines()[-1].endswith("failed=0 not_retried=0 malformed=3 results=40")
    # The tenant's usage has every line, and at most what was in flight at the kill twice.
    records = wait_for_records(stack.metering, len(valid))
    assert {(r.tenant, r.priority, r.status) for r in records} == {("nightly", "batch", 200)}
    assert len(valid) <= len(records) <= len(valid) + 2
    usage = subprocess.run([FAB, "usage", "-s", "local"], capture_output=True, text=True, env=stack.env)
    nightly = next(line for line in usage.stdout.splitlines() if "nightly" in line)
    assert f" {len(records)} " in nightly


def wait_for_records(path: Path, count: int) -> list:
    """The gateway's metering records once at least ``count`` are flushed and no more arrive (it
    writes every 0.2 s; a request answered after its client was killed is recorded too)."""
    deadline = time.monotonic() + 10
    seen = -1
    while True:
        records = read_records(str(path)).records if path.exists() else []
        if (len(records) >= count and len(records) == seen) or time.monotonic() > deadline:
            return records
        seen = len(records) if len(records) >= count else -1
        time.sleep(0.5)
