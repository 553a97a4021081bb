"""When the runtime-down alarm counts a host's runtime as down on EC2 (the host's own verdict,
published as ``RuntimeUp``) and on Kubernetes (the same rule in PromQL): not ready, not draining,
and past its start."""

from __future__ import annotations

from frontier_hostside.names import DRAINING_METRIC, HOST_BOOT_ALLOWANCE_S, PROCESS_START_METRIC, READY_METRIC
from frontier_hostside.node_boot import runtime_down

from frontier.alarms import HOSTS, NAMED_ALARMS
from frontier.targets import load_stack

NOW = 1_000_000.0
ALLOWANCE = 600.0  # rollout.readiness_timeout_s
LONG_AGO = 0.0


def scrape(
    ready: float, draining: float = 0.0, started: float = NOW - 3600
) -> list[tuple[str, dict[str, str], float]]:
    return [(READY_METRIC, {}, ready), (DRAINING_METRIC, {}, draining), (PROCESS_START_METRIC, {}, started)]


def down(samples, launched_at=None, booted_at=LONG_AGO) -> bool:  # noqa: ANN001
    return runtime_down(samples, NOW, launched_at, booted_at, ALLOWANCE)


def test_a_ready_runtime_is_up():
    assert not down(scrape(ready=1))


def test_a_runtime_that_served_for_an_hour_and_is_not_ready_is_down():
    assert down(scrape(ready=0))


def test_a_draining_runtime_is_stopping_not_down():
    assert not down(scrape(ready=0, draining=1))


def test_a_runtime_loading_within_the_start_allowance_is_starting():
    assert not down(scrape(ready=0, started=NOW - ALLOWANCE + 1))


def test_a_runtime_loading_longer_than_a_rollout_would_wait_is_down():
    assert down(scrape(ready=0, started=NOW - ALLOWANCE))


def test_a_silent_runtime_just_launched_by_the_agent_is_starting():
    assert not down(None, launched_at=NOW - 5)


def test_a_silent_runtime_launched_longer_ago_than_the_allowance_is_down():
    assert down(None, launched_at=NOW - ALLOWANCE - 1)


def test_a_booting_host_before_its_first_launch_is_starting_as_long_as_its_launch_hook_waits():
    assert not down(None, booted_at=NOW - HOST_BOOT_ALLOWANCE_S - ALLOWANCE + 1)
    assert down(None, booted_at=NOW - HOST_BOOT_ALLOWANCE_S - ALLOWANCE)


def test_the_kubernetes_rule_excepts_draining_and_young_processes_and_counts_at_least_two_minutes():
    settings = load_stack("eks-prod")
    alarm = NAMED_ALARMS["runtime-down"]
    rule = alarm.prometheus(settings, HOSTS)
    allowance = int(settings.rollout.readiness_timeout_s)
    assert rule.expr.startswith('(frontier_ready{job="frontier-runtime"} == 0)')
    assert 'unless on(instance) (frontier_draining{job="frontier-runtime"} == 1)' in rule.expr
    assert (
        f'unless on(instance) (time() - process_start_time_seconds{{job="frontier-runtime"}} < {allowance})'
        in rule.expr
    )
    assert rule.for_s == 60 * alarm.minutes(settings) and alarm.minutes(settings) >= 2


def test_on_ec2_a_down_host_fires_after_runtime_down_for_s_in_whole_minutes_not_five():
    settings = load_stack("prod")
    alarm = NAMED_ALARMS["runtime-down"]
    long = settings.model_copy(
        update={"alerts": settings.alerts.model_copy(update={"runtime_down_for_s": 400})}
    )
    assert alarm.minutes(settings) == max(2, -(-int(settings.alerts.runtime_down_for_s) // 60))
    assert alarm.minutes(long) == 7
    condition = alarm.cloudwatch(settings)
    assert condition.metric == "RuntimeUp" and condition.evaluation_periods == alarm.minutes(settings)
