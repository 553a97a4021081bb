"""Self-healing on a real cluster: the host agent's supervisor brings a killed runtime back.

Two sshd hosts on loopback aliases, HAProxy with readiness checks, moto, and the real runtime
deployed from its wheel by the rollout. Under a steady streamed load through HAProxy, host-1's
runtime is killed with SIGKILL; its supervisor restarts it, HAProxy puts it back in rotation, and
the time each step took is printed. Requests streaming from the killed runtime at that instant are
cut (a streamed answer cannot be retried elsewhere once it has begun); every request sent after the
kill must succeed: HAProxy retries a refused connection on the other host until its health check
takes the dead one out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from harness import API_KEY, Cluster, push_model, register_wheel, start_cluster

from frontier.fleet.host import HostSession
from frontier.fleet.inventory import LocalConnection
from frontier.loadtest.client import BackgroundLoad, Target
from frontier.rollout.deploy import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 2.0  # requests/s through HAProxy: well within one host's capacity


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path):
    # moto's in-process state is shared by every cluster of this test process: an API-key secret of
    # its own, and a reset at the end, keep this cluster out of the other modules' way.
    c = start_cluster(
        tmp_path_factory.mktemp("supervised"),
        2,
        {"runtime.api_keys_secret": "frontier/local/supervised-api-keys"},
    )
    try:
        push_model(c, tiny_model)
        result = deploy(c.environment(), register_wheel(c, cache=c.base / "artifacts").digest)
        assert result.outcome == "succeeded"
        yield c
    finally:
        reset = urllib.request.Request(f"{c.endpoint}/moto-api/reset", method="POST")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(reset, timeout=5).close()
        c.stop()


def runtime_pid(cluster: Cluster, name: str) -> int:
    host = next(h for h in cluster.hosts if h.name == name)
    return int((Path(host.root) / "run" / "runtime.pid").read_text())


def ready(cluster: Cluster, address: str) -> bool:
    url = f"http://{address}:{cluster.settings.runtime.port}{cluster.settings.health.readiness_path}"
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def until(predicate, timeout: float) -> float:
    """Seconds until ``predicate()`` holds (polled every 50 ms)."""
    started = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - started < timeout, "timed out"
        time.sleep(0.05)
    return time.perf_counter() - started


def test_a_killed_runtime_is_restarted_by_its_supervisor_and_back_in_rotation(cluster, capsys):
    host = cluster.hosts[0]
    balancer = cluster.environment().balancer
    target = Target(
        base_url=f"http://127.0.0.1:{cluster.settings.local.balancer_port}",
        model=cluster.settings.model.name,
        api_key=API_KEY,
        prompt_tokens=16,
        max_tokens=16,
        timeout_s=60,
    )
    load = BackgroundLoad(target, RATE, seed=5).start()
    try:
        time.sleep(2.0)  # traffic flows on both hosts first
        killed_pid = runtime_pid(cluster, host.name)
        os.kill(killed_pid, signal.SIGKILL)
        killed_at = time.perf_counter()
        back = until(lambda: runtime_pid(cluster, host.name) != killed_pid, 30)
        serving = until(lambda: ready(cluster, host.address), 120) + back
        in_rotation = until(lambda: balancer.state(host) == "UP", 60) + serving
        time.sleep(2.0)  # and traffic flows on the restarted host again
    finally:
        samples = load.stop()

    session = HostSession(cluster.settings, host, LocalConnection(host))
    try:
        status = session.status()
    finally:
        session.close()
    assert status.runs(status.current) and status.ready and status.live
    assert status.supervised and status.restarts == 1
    assert "exited with status -9" in status.last_restart

    after_kill = [s for s in samples if s.sent_at > killed_at]
    cut = [s for s in samples if not s.ok and s.sent_at <= killed_at]
    with capsys.disabled():
        print(
            f"\n  supervisor e2e: kill -9 {host.name}: relaunched after {back:.2f}s, ready after "
            f"{serving:.2f}s, back in HAProxy rotation after {in_rotation:.2f}s; requests sent={len(samples)} "
            f"failed={len(samples) - sum(s.ok for s in samples)} (cut while streaming from the killed runtime: "
            f"{len(cut)}; sent after the kill: {len(after_kill)}, failed: {sum(not s.ok for s in after_kill)})"
        )
    assert after_kill and all(s.ok for s in after_kill), [s.error for s in after_kill if not s.ok]
