"""The local autoscaler's decisions: target tracking on queue depth, with delays and a cooldown."""

from __future__ import annotations

import math

import pytest

from frontier.config.schema import LocalAutoscaler
from frontier.targets import load_stack
from frontier.targets.local.autoscaler import Decider, Observation, Policy, bucket_p90_ms

TIMING = LocalAutoscaler(interval_s=1, scale_out_after_s=5, scale_in_after_s=10, cooldown_s=3)


def policy(min_size: int = 1, max_size: int = 4) -> Policy:
    return Policy(
        target_queue_depth=4,
        min_size=min_size,
        max_size=max_size,
        max_concurrency=8,
        scale_in_utilisation=0.5,
        timing=TIMING,
    )


def feed(decider: Decider, seconds: range, hosts: int, waiting: float, running: float):
    decisions = [decider.feed(Observation(float(t), hosts, waiting, running)) for t in seconds]
    return [d for d in decisions if d is not None]


def test_a_queue_over_target_scales_out_only_once_it_has_lasted_the_delay():
    decider = Decider(policy())
    assert feed(decider, range(0, 5), hosts=1, waiting=6, running=8) == []
    [decision] = feed(decider, range(5, 6), hosts=1, waiting=6, running=8)
    assert (decision.current, decision.desired, decision.direction) == (1, 2, "out")
    assert "waiting per host" in decision.reason


def test_scale_out_is_proportional_to_the_queue_and_capped_at_max_size():
    decider = Decider(policy(max_size=3))
    [decision] = feed(decider, range(0, 6), hosts=1, waiting=40, running=8)
    assert decision.desired == 3  # ceil(40 / 4) = 10 hosts wanted, max_size 3


def test_a_queue_that_dips_under_target_restarts_the_delay():
    decider = Decider(policy())
    assert feed(decider, range(0, 4), hosts=1, waiting=6, running=8) == []
    assert feed(decider, range(4, 5), hosts=1, waiting=2, running=8) == []
    assert feed(decider, range(5, 9), hosts=1, waiting=6, running=8) == []


def test_an_idle_group_scales_in_by_one_after_the_delay_and_never_below_min_size():
    decider = Decider(policy(min_size=2))
    [decision] = feed(decider, range(0, 11), hosts=3, waiting=0, running=1)
    assert (decision.current, decision.desired, decision.direction) == (3, 2, "in")
    decider.changed(11)
    assert feed(decider, range(11, 40), hosts=2, waiting=0, running=0) == []


def test_an_empty_queue_alone_does_not_scale_in_when_fewer_hosts_could_not_carry_the_load():
    # 2 hosts of 8 concurrency run 12 requests: one host at 50% (4 requests) could not carry them.
    decider = Decider(policy())
    assert feed(decider, range(0, 60), hosts=2, waiting=0, running=12) == []


def test_nothing_is_decided_during_the_cooldown_after_a_change():
    decider = Decider(policy())
    decider.changed(0)
    assert feed(decider, range(0, 3), hosts=1, waiting=20, running=8) == []
    assert feed(decider, range(3, 8), hosts=1, waiting=20, running=8) == []
    assert len(feed(decider, range(8, 9), hosts=1, waiting=20, running=8)) == 1


def test_a_host_that_does_not_answer_holds_every_decision():
    decider = Decider(policy())
    seen = [decider.feed(Observation(float(t), 2, 20, 16, unreachable=1)) for t in range(0, 30)]
    assert seen == [None] * 30


def test_the_policy_comes_from_the_stack():
    settings = load_stack("local")
    p = Policy.of(settings, settings.only_pool)
    group = settings.serving_group
    assert (p.min_size, p.max_size, p.target_queue_depth) == (
        group.min_size,
        group.max_size,
        group.target_queue_depth,
    )
    assert p.max_size <= len(settings.inventory.hosts)


@pytest.mark.parametrize("field", ["scale_out_after_s", "cooldown_s"])
def test_negative_delays_are_refused(field):
    with pytest.raises(ValueError, match=field):
        LocalAutoscaler(**{field: -1})


def test_fab_scale_on_the_local_stack_refuses_a_size_outside_the_group_and_touches_nothing(
    monkeypatch, capsys
):
    from fabric.main import program

    from frontier import project

    # Nothing of the local stack needs to run: the refusal reaches neither moto nor a host.
    monkeypatch.setenv("FRONTIER_STACK", "local")
    monkeypatch.chdir(project.root())
    with pytest.raises(SystemExit) as exit_info:
        program.run(["fab", "scale", "--replicas", "9"])
    err = capsys.readouterr().err
    assert exit_info.value.code != 0
    assert "--replicas 9" in err and "min_size 2 and max_size 4" in err


def slow_policy() -> Policy:
    return Policy(
        target_queue_depth=4,
        min_size=1,
        max_size=4,
        max_concurrency=8,
        scale_in_utilisation=0.5,
        timing=TIMING,
        ttft_scale_out_ms=1000,
    )


def feed_ttft(decider: Decider, seconds: range, ttft_p90_ms: float | None):
    seen = (Observation(float(t), 2, 0, 4, ttft_p90_ms=ttft_p90_ms) for t in seconds)
    return [d for d in map(decider.feed, seen) if d is not None]


def test_a_ttft_p90_over_the_slo_adds_a_host_with_nothing_waiting_once_it_has_lasted_the_delay():
    decider = Decider(slow_policy())
    assert feed_ttft(decider, range(0, 5), ttft_p90_ms=1500) == []
    [decision] = feed_ttft(decider, range(5, 6), ttft_p90_ms=1500)
    assert (decision.current, decision.desired) == (2, 3)
    assert decision.reason.startswith("TTFT p90 1,500 ms > slo.ttft_ms 1000")


def test_a_ttft_p90_under_the_slo_or_unknown_adds_nothing():
    decider = Decider(slow_policy())
    assert feed_ttft(decider, range(0, 4), ttft_p90_ms=1500) == []
    assert feed_ttft(decider, range(4, 5), ttft_p90_ms=None) == []  # no first token since: restarts the delay
    assert feed_ttft(decider, range(5, 9), ttft_p90_ms=900) == []


def test_the_stack_s_slo_ttft_is_the_local_latency_threshold():
    settings = load_stack("local")
    assert Policy.of(settings, settings.only_pool).ttft_scale_out_ms == settings.slo.ttft_ms


def test_the_p90_of_what_a_histogram_gained_is_interpolated_within_its_bucket():
    before = {0.1: 10.0, 0.5: 10.0, 1.0: 10.0, math.inf: 10.0}
    after = {0.1: 60.0, 0.5: 100.0, 1.0: 110.0, math.inf: 110.0}  # gained 50, 90, 100 cumulative
    # rank 90 of 100 falls at the top of (0.1, 0.5]: 40 observations there, 40 needed.
    assert bucket_p90_ms(before, after) == pytest.approx(500)
    assert bucket_p90_ms(after, after) is None  # nothing observed
    assert bucket_p90_ms(after, before) is None  # counts fell: a runtime restarted
