"""Self-healing on a real cluster: the host agent's supervisor brings a killed runtime back.

Two sshd hosts on loopback aliases, HAProxy with readiness checks, moto, and the real runtime
deployed from its wheel by the rollout. Under a steady load of non-streamed requests through
HAProxy, host-1's runtime is killed with SIGKILL; its supervisor restarts it, HAProxy puts it back
in rotation, and the time each step took is printed. No request fails: one the killed runtime was
answering gets an empty response, which HAProxy retries on the other host (``retry-on
empty-response`` with the body buffered), as it retries refused connections until its health
check takes the dead host out. (A *streamed* answer that has begun cannot move: that one would be
cut, which is why the load here is non-streamed.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness import API_KEY, deployed_cluster

from frontier.hosts.session import HostSession
from frontier.loadtest.client import BackgroundLoad, Target
from frontier.targets.local.connection import LocalConnection
from frontier.targets.local.heal import kill_and_recover

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 2.0  # requests/s through HAProxy: well within one host's capacity


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path):
    secret = {"runtime.api_keys_secret": "frontier/local/supervised-api-keys"}
    with deployed_cluster(tmp_path_factory.mktemp("supervised"), 2, tiny_model, secret) as c:
        yield c


def test_a_killed_runtime_is_restarted_by_its_supervisor_and_back_in_rotation_with_no_failed_request(
    cluster, capsys
):
    host = cluster.hosts[0]
    balancer = cluster.backend().balancer()
    target = Target(
        base_url=f"http://127.0.0.1:{cluster.settings.local.balancer_port}",
        model=cluster.settings.model.name,
        api_key=API_KEY,
        prompt_tokens=16,
        max_tokens=16,
        timeout_s=60,
        stream=False,
    )
    load = BackgroundLoad(target, RATE, seed=5).start()
    try:
        time.sleep(2.0)  # traffic flows on both hosts first
        recovery = kill_and_recover(cluster.settings, cluster.settings.only_pool, host, balancer)
        time.sleep(2.0)  # and traffic flows on the restarted host again
    finally:
        samples = load.stop()

    session = HostSession(cluster.settings, cluster.settings.only_pool, host, LocalConnection(host))
    try:
        status = session.status()
    finally:
        session.close()
    assert status.runs(status.current) and status.ready and status.live
    assert status.supervised and status.restarts == 1
    assert "exited with status -9" in status.last_restart
    failed = [s for s in samples if not s.ok]
    with capsys.disabled():
        print(
            f"\n  supervisor e2e: kill -9 {host.name}: relaunched after {recovery.relaunched_s:.2f}s, ready after "
            f"{recovery.ready_s:.2f}s, back in HAProxy rotation after {recovery.in_rotation_s:.2f}s; "
            f"requests sent={len(samples)} failed={len(failed)}"
        )
    assert samples and not failed, [s.error for s in failed]
