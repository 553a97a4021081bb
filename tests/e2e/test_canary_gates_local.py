"""The local stack's canary held to the release it replaces (tests/e2e/conftest.py's cluster: two
host slots over real sshd, HAProxy, moto, the real runtime with release A): a canary that answers
wrongly fails the verification set, and one far slower than the old release fails
``rollout.gate.max_p99_ratio``; either way the rollout stops at the canary and restores it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from frontier import project
from frontier.demo.canary import CANARY_SET, variant_c
from frontier.loadtest.client import BackgroundLoad, Target
from frontier.rollout.deploy import deploy
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from tests.e2e.test_rollout_under_load import running_releases

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def rolled_back(settings, digest: str) -> str:
    with pytest.raises(RolloutFailed) as failed:
        deploy(backend_for(settings), digest)
    result = failed.value.result
    assert result.outcome == "rolled_back", result
    return result.reason


def test_a_canary_that_answers_wrongly_fails_its_verification_and_is_restored(cluster):
    # Release C: A with an fp8 KV cache, its canary verified; nothing recorded yet, so the old
    # release's greedy outputs are recorded first, from the host still on it.
    settings_c = variant_c(cluster.settings, project.root() / CANARY_SET)
    reason = rolled_back(settings_c, cluster.digest)
    assert "verification: pass rate" in reason and "(golden: " in reason
    assert set(running_releases(cluster.settings).values()) == {cluster.release_a}
    store = backend_for(cluster.settings).history_store()
    assert store.s3.get_object(
        Bucket=store.bucket, Key=f"{store.prefix}releases/{cluster.release_a}/verify/canary.golden.json"
    )


def test_a_canary_slower_than_the_old_release_fails_max_p99_ratio_and_is_restored(cluster):
    # Release S: A whose idle engine waits a second for companions, so each request the canary
    # answers under a light load takes a second longer than on the host still on A.
    document = yaml.safe_load(Path(cluster.settings.source).read_text())
    document["config"]["frontier:runtime"]["batch"]["window_ms"] = 1000
    document["config"]["frontier:rollout"]["gate"].update(window_s=10, max_p99_ratio=1.3)
    path = Path(cluster.settings.source).parent / "variants" / "slow" / "Pulumi.local.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    settings_s = load_stack("local", path=path)
    target = Target(
        base_url=local.balancer_url(cluster.settings),
        model=cluster.settings.model.name,
        api_key=local.api_key(cluster.settings, cluster.settings.only_pool),
        prompt_tokens=16,
        max_tokens=8,
        timeout_s=60,
    )
    load = BackgroundLoad(target, 2.0, seed=5).start()
    time.sleep(1.0)
    try:
        reason = rolled_back(settings_s, cluster.digest)
    finally:
        samples = load.stop()
    assert "rollout.gate.max_p99_ratio 1.3 x the old release's" in reason, reason
    assert set(running_releases(cluster.settings).values()) == {cluster.release_a}
    assert samples and all(s.ok for s in samples)
