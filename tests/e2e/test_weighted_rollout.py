"""A traffic-weighted rollout and a mid-rollout revert on the real local stack, under load.

Two host slots over real sshd, HAProxy (weighted round robin, weights set through its admin
socket), moto, and the real runtime; the stack rolls by ``rollout.traffic_steps`` [25, 50, 100].
A steady Poisson load runs through the balancer the whole time while a sampler reads, every 0.1 s,
how many replicas HAProxy could route a request to (UP, weight above zero). Release B rolls step by
step and back; a release far slower than the old one fails its first gated step on
``rollout.gate.max_p99_ratio`` with a quarter of the traffic on it, and reverts. No client sees a
failed request, and no sample, nor any step's own check, finds fewer than one routable replica.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from frontier.config.schema import Settings
from frontier.demo.run import variant_b
from frontier.loadtest.client import BackgroundLoad, RequestSample, Target
from frontier.release import weights
from frontier.release.artifact import build_wheel
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import Event, RolloutFailed, RolloutResult
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from tests.e2e.conftest import stack_variant
from tests.e2e.stackcopy import write_local_stack
from tests.e2e.test_rollout_under_load import running_releases

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = [25, 50, 100]
RATE = 1.5  # requests/s: one host carries it alone at the 100 % step and while the other switches


@dataclass
class WeightedCluster:
    settings: Settings
    digest: str
    release_a: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> WeightedCluster:
    """Two host slots on 127.0.2.2-3, the stack rolling by traffic share; release A deployed on both
    (the first release rolls by batch: nothing served before it)."""
    root = tmp_path_factory.mktemp("weighted")
    gate = {"window_s": 4, "max_error_rate": 0.01, "max_p99_latency_ms": 10000, "min_requests": 2}
    edit = {"rollout": {"traffic_steps": STEPS, "gate": gate}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(root, hosts=2, edit=edit)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        settings = load_stack("local")
        try:
            model = root / "model"
            subprocess.run(
                [sys.executable, "-m", "frontier_runtime.tiny", "--out", str(model)],
                check=True,
                capture_output=True,
            )
            local.up(settings)
            s3 = backend_for(settings).aws_client("s3")
            model_settings = settings.model
            weights.push(s3, model, model_settings.weights_uri, model_settings.name, model_settings.version)
            artifact, wheel = build_wheel()
            backend_for(settings).history_store().put_artifact(artifact, wheel)
            # The first release is deployed before any client sends a request: its gate counts none.
            first = stack_variant(settings, "first", "rollout.gate", min_requests=0)
            result = deploy(backend_for(first), artifact.digest)
            yield WeightedCluster(settings, artifact.digest, result.release)
        finally:
            local.down(settings)


@dataclass
class Watch:
    """The load, a sampler of routable replicas, and the rollout's own events, while a roll runs."""

    settings: Settings
    samples: list[RequestSample] = field(default_factory=list)
    routable: list[int] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        target = Target(
            base_url=local.balancer_url(self.settings),
            model=self.settings.model.name,
            api_key=local.api_key(self.settings, self.settings.only_pool),
            prompt_tokens=16,
            max_tokens=16,
            timeout_s=60,
        )
        self._load = BackgroundLoad(target, RATE, seed=17).start()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        time.sleep(1.5)  # traffic flows before any weight changes
        return self

    def _sample(self) -> None:
        backend = backend_for(self.settings)
        balancer, hosts = backend.balancer(), backend.hosts()
        while not self._stop.is_set():
            self.routable.append(len(balancer.routable(hosts)))
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.samples = self._load.stop()
        self._stop.set()
        self._sampler.join(timeout=5)

    @property
    def failed(self) -> list[RequestSample]:
        return [s for s in self.samples if not s.ok]

    def step_checks(self) -> list[str]:
        """The rollout's own invariant check after each of its steps."""
        return [f"{e.status}: {e.detail}" for e in self.events if e.phase == "routable"]


def report(capsys, watch: Watch, line: str) -> None:
    with capsys.disabled():
        print(
            f"\n  e2e: {line}; requests sent={len(watch.samples)} failed={len(watch.failed)}; "
            f"routable replicas sampled {len(watch.routable)} times, min {min(watch.routable)}"
        )


def assert_never_unroutable(watch: Watch) -> None:
    assert watch.failed == [], {s.error for s in watch.failed}
    assert len(watch.routable) > 50 and min(watch.routable) >= 1, watch.routable
    checks = watch.step_checks()
    assert checks and all(c.startswith("ok: ") for c in checks), checks


def test_a_weighted_rollout_and_its_rollback_shift_traffic_step_by_step_losing_no_request(cluster, capsys):
    settings_b = variant_b(cluster.settings)
    with Watch(cluster.settings) as watch:
        deployed = deploy(backend_for(settings_b), cluster.digest, reporter=watch.events.append)
        rolled = rollback(backend_for(cluster.settings), reporter=watch.events.append)
    report(capsys, watch, f"B {deployed.duration_s:.1f}s, back to A {rolled.duration_s:.1f}s")
    for result in (deployed, rolled):
        assert result.outcome == "succeeded", result.reason
        assert result.strategy.startswith("weighted: 25 % -> 50 % -> 100 %"), result.strategy
        assert [(s.percent, s.outcome) for s in result.steps] == [(p, "passed") for p in STEPS]
        # Every step's gate read both releases' own series; the new one served its min_requests.
        assert all(s.new and s.old and s.routable >= 1 for s in result.steps), result.steps
    assert rolled.release == cluster.release_a
    assert_never_unroutable(watch)
    # The steps' checks: after the canary at 0 %, each step, the old host switched, weights even.
    assert len(watch.step_checks()) == 2 * (2 + len(STEPS) + 2)
    assert set(running_releases(cluster.settings).values()) == {cluster.release_a}


def slow_release(settings: Settings) -> Settings:
    """Release S: A whose idle engine waits a second for companions before each batch, gated on a
    p99 at most 1.3 x the old release's."""
    document = yaml.safe_load(Path(settings.source).read_text())
    document["config"]["frontier:runtime"]["batch"]["window_ms"] = 1000
    document["config"]["frontier:rollout"]["gate"].update(max_p99_ratio=1.3)
    path = Path(settings.source).parent / "variants" / "slow" / Path(settings.source).name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack(settings.stack, path=path)


def test_a_release_failing_a_traffic_step_reverts_mid_rollout_losing_no_request(cluster, capsys):
    before = running_releases(cluster.settings)
    with Watch(cluster.settings) as watch, pytest.raises(RolloutFailed) as failure:
        deploy(backend_for(slow_release(cluster.settings)), cluster.digest, reporter=watch.events.append)
    result: RolloutResult = failure.value.result
    failed_step = result.steps[-1]
    report(
        capsys,
        watch,
        f"S {result.outcome} at {failed_step.percent} % in {result.duration_s:.1f}s ({result.reason[:140]})",
    )
    assert result.outcome == "rolled_back"
    # The revert came after traffic had moved: the failing step gave the new release a share.
    assert failed_step.outcome == "failed" and failed_step.percent in STEPS
    assert "rollout.gate.max_p99_ratio 1.3 x the old release's" in failed_step.reason
    assert result.reason.startswith(f"traffic step {failed_step.percent} %: p99 ")
    assert_never_unroutable(watch)
    # The revert's own checks: all traffic back on the old host, then even weights after the restore.
    assert [c.split(" after ")[-1] for c in watch.step_checks()[-2:]] == [
        "all traffic back on the old release",
        "the revert's weights even again",
    ]
    assert running_releases(cluster.settings) == before == dict.fromkeys(before, cluster.release_a)
    # The history holds the step and its reason, and `fab history` shows them.
    record = backend_for(cluster.settings).history_store().records()[-1]
    assert record["outcome"] == "rolled_back"
    assert record["steps"][-1]["percent"] == failed_step.percent
    assert record["steps"][-1]["reason"] == failed_step.reason
    env = {**os.environ, "FRONTIER_STACKS_DIR": str(Path(cluster.settings.source).parent)}
    shown = subprocess.run(
        [sys.executable, "-m", "fabric", "history", "-s", "local"], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    steps = shown.stdout.partition("traffic steps of the last deploy")[2]
    assert f"{failed_step.percent} %" in steps and "failed" in steps
