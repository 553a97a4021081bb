"""The demo's path under load through HAProxy: no client may see a failed request.

Two host slots over real sshd, HAProxy with readiness checks, moto for S3 and Secrets Manager, and
the real runtime serving the tiny model. A steady Poisson load runs through the balancer while
release B (a batching change) is deployed and rolled back, and while a release that cannot become
ready is tried on the canary and rolled back automatically.
"""

from __future__ import annotations

import time

import pytest

from frontier.demo.run import variant_b
from frontier.hosts.session import HostSession
from frontier.loadtest.client import BackgroundLoad, Target
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import RolloutFailed
from frontier.targets import backend_for
from frontier.targets.local import cluster as local
from tests.e2e.conftest import stack_variant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 1.5  # requests/s: well within one host's capacity, so a drained host is not missed


def steady_load(settings) -> BackgroundLoad:
    target = Target(
        base_url=local.balancer_url(settings),
        model=settings.model.name,
        api_key=local.api_key(settings, settings.only_pool),
        prompt_tokens=16,
        max_tokens=16,
        timeout_s=60,
    )
    load = BackgroundLoad(target, RATE, seed=11).start()
    time.sleep(1.5)  # traffic flows before anything is drained
    return load


def running_releases(settings) -> dict[str, str]:
    out = {}
    for host in backend_for(settings).hosts():
        session = HostSession(settings, settings.only_pool, host, backend_for(settings).connect(host))
        try:
            facts = session.facts()
            out[host.name] = facts.running_release if facts.running else ""
        finally:
            session.close()
    return out


def report(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n  e2e: {line}")


def test_deploy_b_then_rollback_to_a_under_load_loses_no_request(cluster, capsys):
    settings = cluster.settings
    settings_b = variant_b(settings)  # the demo's release B: max_batch_size halved, a 10 ms batch window
    assert (settings_b.runtime.batch.max_batch_size, settings_b.runtime.batch.window_ms) == (8, 10)
    load = steady_load(settings)
    try:
        deployed = deploy(backend_for(settings_b), cluster.digest)
        rolled = rollback(backend_for(settings))
    finally:
        samples = load.stop()
    failed = [s for s in samples if not s.ok]
    report(
        capsys,
        f"deploy B {deployed.release} {deployed.duration_s:.1f}s, rollback to A {rolled.release} "
        f"{rolled.duration_s:.1f}s; requests sent={len(samples)} failed={len(failed)} "
        f"(initial deploy of A: {cluster.deploy_a_s:.1f}s)",
    )
    assert deployed.outcome == rolled.outcome == "succeeded"
    assert deployed.release != cluster.release_a
    assert rolled.release == cluster.release_a
    assert len(samples) >= 10
    assert failed == [], {s.error for s in failed}
    assert set(running_releases(settings).values()) == {cluster.release_a}


def test_a_release_failing_readiness_on_the_canary_is_rolled_back_while_clients_see_no_errors(
    cluster, capsys
):
    settings = cluster.settings
    # A weights version that was never pushed: the runtime cannot load a model, so it never turns ready.
    broken = stack_variant(settings, "broken", "model", version="v-never-pushed")
    before = running_releases(settings)
    load = steady_load(settings)
    try:
        with pytest.raises(RolloutFailed) as failure:
            deploy(backend_for(broken), cluster.digest)
    finally:
        samples = load.stop()
    result = failure.value.result
    failed = [s for s in samples if not s.ok]
    outcomes = {h.name: h.outcome for h in result.hosts}
    report(
        capsys,
        f"broken release {result.release}: {result.outcome} in {result.duration_s:.1f}s ({result.reason.splitlines()[0][:100]}); "
        f"hosts {outcomes}; requests sent={len(samples)} failed={len(failed)}",
    )
    assert result.outcome == "rolled_back"
    assert "readiness" in result.reason
    canary, other = (h.name for h in backend_for(settings).hosts())
    assert outcomes[canary] == "restored"
    assert outcomes[other] in ("pending", "untouched")  # the rollout stopped before reaching it
    assert failed == [], {s.error for s in failed}
    assert running_releases(settings) == before == {canary: cluster.release_a, other: cluster.release_a}


def test_a_canary_that_fails_the_verification_set_is_rolled_back_naming_the_failed_cases(cluster, capsys):
    """Release A's greedy outputs are the golden set; a release whose only change is an fp8 KV cache
    serves without errors but answers differently, so its canary fails verification and rolls back
    (the demo's step, frontier/demo/canary.py)."""
    from frontier.demo.canary import wrong_answers_rolled_back

    settings = cluster.settings
    before = running_releases(settings)
    target = Target(
        base_url=local.balancer_url(settings),
        model=settings.model.name,
        api_key=local.api_key(settings, settings.only_pool),
        prompt_tokens=16,
        max_tokens=16,
        timeout_s=60,
    )
    result, samples, reason = wrong_answers_rolled_back(
        settings, cluster.digest, cluster.release_a, target, RATE, None
    )
    failed = [s for s in samples if not s.ok]
    report(
        capsys,
        f"fp8 canary {result.release}: {result.outcome} in {result.duration_s:.1f}s; "
        f"history: {reason[:160]}; requests sent={len(samples)} failed={len(failed)}",
    )
    assert result.outcome == "rolled_back"
    assert "verification" in reason and "(golden:" in reason
    assert any(name in reason for name in ("story", "sea", "colours"))
    assert "answers (normal" not in reason  # only the failed cases are named
    assert failed == [], {s.error for s in failed}
    assert running_releases(settings) == before
