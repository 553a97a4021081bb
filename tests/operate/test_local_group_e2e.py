"""The local group on a real cluster: a slot nobody deployed to joins by itself, and the autoscaler
grows and shrinks the group on the runtimes' queue depth, under load, with no failed request.

Two sshd slots on loopback aliases, HAProxy with readiness checks over both, moto, the AWS CLI, and
the real runtime. One slot serves (deployed by the rollout), the other is spare. A launch runs the
same ``bootstrap.py boot`` that cloud-init runs on an EC2 host, on the slot, against the history in
moto's S3. The runtimes admit 2 requests at a time, so a modest closed-loop load builds a queue.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from harness import API_KEY, Cluster, deployed_cluster

from frontier.hosts.session import HostSession
from frontier.loadtest.client import BackgroundLoad, Target, run_concurrency
from frontier.loadtest.stats import RequestSample
from frontier.targets import backend_for
from frontier.targets.local.autoscaler import Autoscaler
from frontier.targets.local.connection import LocalConnection
from frontier.targets.local.group import LocalFleet

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path):
    changes = {
        "runtime.api_keys_secret": "frontier/local/group-api-keys",
        "runtime.max_concurrency": 2,
        "runtime.batch.max_batch_size": 2,
        "local.autoscaler.scale_out_after_s": 2,
        "local.autoscaler.scale_in_after_s": 3,
        "local.autoscaler.cooldown_s": 1,
        "local.autoscaler.interval_s": 0.5,
    }
    group = {"min_size": 1, "desired_size": 1, "max_size": 2, "target_queue_depth": 2}
    with deployed_cluster(tmp_path_factory.mktemp("group"), 2, tiny_model, changes, group) as c:
        yield c


def fleet_of(cluster: Cluster) -> LocalFleet:
    return backend_for(cluster.settings).fleet()


def target(cluster: Cluster, max_tokens: int = 16) -> Target:
    return Target(
        base_url=f"http://127.0.0.1:{cluster.settings.local.balancer_port}",
        model=cluster.settings.model.name,
        api_key=API_KEY,
        prompt_tokens=16,
        max_tokens=max_tokens,
        timeout_s=60,
        stream=False,
    )


def served_by(cluster: Cluster, name: str) -> int:
    """Requests HAProxy sent to server ``name`` so far (its stats' ``stot``)."""
    host = next(h for h in cluster.slots if h.name == name)
    return int(cluster.backend().balancer().stats(host)["stot"] or 0)


def test_a_slot_never_deployed_to_bootstraps_the_current_release_and_joins_the_balancer(cluster, capsys):
    fleet = fleet_of(cluster)
    current = cluster.store().last_good()["release"]
    [spare] = fleet.spares()
    assert not (Path(spare.root) / "current").exists()  # nothing was ever deployed there

    load = BackgroundLoad(target(cluster), 2.0, seed=3).start()
    try:
        time.sleep(1.0)
        launched = fleet.launch(spare, timeout_s=90)
        before = served_by(cluster, spare.name)
        time.sleep(3.0)  # traffic reaches the new slot
        after = served_by(cluster, spare.name)
    finally:
        samples = load.stop()

    session = HostSession(cluster.settings, cluster.settings.only_pool, spare, LocalConnection(spare))
    try:
        status = session.status()
    finally:
        session.close()
    boots = [json.loads(cluster.store()._get(k)) for k in cluster.store()._keys("boots/")]
    failed = [s for s in samples if not s.ok]
    with capsys.disabled():
        print(
            f"\n  launch {spare.name}: booted {launched.release} in {launched.boot_s:.1f}s, in rotation after "
            f"{launched.in_rotation_s:.1f}s, {after - before} request(s) served in its first 3 s; "
            f"requests sent={len(samples)} failed={len(failed)}"
        )
    assert launched.release == current and status.current == current and status.ready
    assert spare.name in fleet.in_service()
    assert after > before
    assert any(b["host"] == spare.name and b["outcome"] == "continued" for b in boots)
    assert not failed, [s.error for s in failed]


def test_a_launch_outside_the_group_bounds_is_refused_and_changes_nothing(cluster):
    fleet = fleet_of(cluster)
    size = fleet.size()
    with pytest.raises(Exception, match="max_size 2"):
        fleet.scale(3)
    with pytest.raises(Exception, match="min_size 1"):
        fleet.scale(0)
    assert fleet.size() == size


class ClosedLoop:
    """``clients`` closed-loop clients in a thread for ``seconds``."""

    def __init__(self, t: Target, clients: int, seconds: float) -> None:
        self.samples: list[RequestSample] = []
        self.thread = threading.Thread(target=self._run, args=(t, clients, seconds), daemon=True)

    def _run(self, t: Target, clients: int, seconds: float) -> None:
        self.samples = list(asyncio.run(run_concurrency(t, clients, seconds, seed=7)).samples)

    def __enter__(self) -> ClosedLoop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join()


def until(predicate, timeout: float) -> float:
    started = time.perf_counter()
    while not predicate():
        assert time.perf_counter() - started < timeout, "timed out"
        time.sleep(0.2)
    return time.perf_counter() - started


def test_the_autoscaler_adds_a_slot_when_the_queue_stays_over_target_and_retires_it_drained(cluster, capsys):
    fleet = fleet_of(cluster)
    fleet.scale(1)  # one host serves; the other slot is spare
    assert fleet.size().desired == 1
    scaler = Autoscaler(cluster.settings, fleet).start()
    try:
        # 8 clients against one runtime admitting 2: about 6 wait, over the target of 2 per host.
        with ClosedLoop(target(cluster, max_tokens=32), clients=8, seconds=40) as busy:
            scaled_out = until(lambda: fleet.size().desired == 2, 90)
        scaled_in = until(lambda: fleet.size().desired == 1, 60)
    finally:
        scaler.stop()
    directions = [d.direction for d, _ in scaler.decisions]
    retired = next(h for h in cluster.slots if h.name not in fleet.in_service())
    failed = [s for s in busy.samples if not s.ok]
    with capsys.disabled():
        print(
            f"\n  autoscaler: out after {scaled_out:.1f}s of load, in {scaled_in:.1f}s after it ended; "
            f"decisions {[f'{d.current}->{d.desired} {o}' for d, o in scaler.decisions]}; "
            f"requests sent={len(busy.samples)} failed={len(failed)}"
        )
    assert directions[:2] == ["out", "in"]
    assert not (Path(retired.root) / "run" / "runtime.pid").exists()  # stopped after draining
    assert not failed, [s.error for s in failed]
