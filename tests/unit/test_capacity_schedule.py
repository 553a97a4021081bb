"""Scheduled and forecast capacity: the settings, what each target renders from them, and the refusals."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from frontier import project
from frontier.config.schedule import Forecast, Schedule, ScheduleWindow, cron_of, forecast_floor
from frontier.errors import StackError
from frontier.targets import load_stack
from frontier.targets.kubernetes.autoscaling import scaled_object, schedule_triggers


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch, stacks_copy):
    monkeypatch.chdir(project.root())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))


PEAK = {
    "name": "weekday-peak",
    "days": ["mon", "tue", "wed", "thu", "fri"],
    "start": "08:30",
    "end": "19:00",
    "min_size": 8,
}


def test_a_window_raises_the_floor_in_its_own_time_zone():
    schedule = Schedule(timezone="America/New_York", windows=(ScheduleWindow(**PEAK),))
    # Thursday 2026-12-03 13:00 UTC is 08:00 in New York (EST, UTC-5): not yet; 14:00 UTC is 09:00.
    assert schedule.floor_at(datetime(2026, 12, 3, 13, 0, tzinfo=UTC)) is None
    assert schedule.floor_at(datetime(2026, 12, 3, 14, 0, tzinfo=UTC)) == 8
    assert schedule.floor_at(datetime(2026, 12, 5, 14, 0, tzinfo=UTC)) is None  # a Saturday


def test_cron_expressions_name_the_days_as_cron_counts_them():
    window = ScheduleWindow(**PEAK)
    assert cron_of(window, window.start) == "30 8 * * 1,2,3,4,5"
    assert (
        cron_of(ScheduleWindow(name="sunday", days=["sun"], start="00:00", end="01:00", min_size=1), "00:00")
        == "0 0 * * 0"
    )


def test_the_forecast_floor_is_the_peak_of_the_lead_a_period_ago_over_one_hosts_load():
    forecast = Forecast(period_s=86_400, lead_s=900, per_host_load=200)
    now = 1_000_000.0
    # Yesterday, 10 minutes after this moment, 1,450 requests were in flight: ceil(1450 / 200) = 8.
    history = [
        (now - 86_400 - 60.0, 300.0),
        (now - 86_400 + 600.0, 1_450.0),
        (now - 86_400 + 1_200.0, 2_000.0),
    ]
    assert forecast_floor(forecast, history, now) == 8  # the 2,000 lies past the 900 s lead
    assert forecast_floor(forecast, history[1:], now) is None  # the history does not reach back a period


def test_overlapping_windows_are_refused_naming_both(changed_stack):
    changed_stack(
        "prod",
        {
            "node_groups[0].schedule.windows": [
                PEAK,
                {"name": "lunch", "days": ["fri", "sat"], "start": "12:00", "end": "14:00", "min_size": 9},
            ]
        },
    )
    with pytest.raises(StackError) as err:
        load_stack("prod")
    message = str(err.value)
    assert "node_groups[0].schedule.windows[1]" in message
    assert (
        "window 'lunch' (12:00-14:00) overlaps window 'weekday-peak' (windows[0], 08:30-19:00) on fri"
        in message
    )


def test_a_window_floor_outside_the_groups_range_is_refused(changed_stack):
    changed_stack("prod", {"node_groups[0].schedule.windows": [{**PEAK, "min_size": 12}]})
    with pytest.raises(
        StackError, match=r"node_groups\[0\].schedule.windows\[0\].min_size = 12: must lie between"
    ):
        load_stack("prod")


def test_a_window_that_ends_before_it_starts_and_an_unknown_zone_are_refused(changed_stack):
    changed_stack(
        "prod",
        {
            "node_groups[0].schedule.windows": [{**PEAK, "start": "22:00", "end": "02:00"}],
            "node_groups[0].schedule.timezone": "Mars/Olympus",
        },
    )
    with pytest.raises(StackError) as err:
        load_stack("prod")
    assert "schedule.windows[0].end = '02:00': must be after" in str(err.value)
    assert "unknown time zone 'Mars/Olympus'" in str(err.value)


def test_kubernetes_renders_each_window_as_a_keda_cron_trigger_beside_the_queue_depth():
    eks = load_stack("eks-prod")
    triggers = scaled_object(eks, eks.only_pool).body["spec"]["triggers"]
    assert [t["name"] for t in triggers] == ["queue-depth", "running", "ttft-p90", "schedule-weekday-peak"]
    assert triggers[3]["metadata"] == {
        "timezone": "America/New_York",
        "start": "30 8 * * 1,2,3,4,5",
        "end": "0 19 * * 1,2,3,4,5",
        "desiredReplicas": "8",
    }
    assert schedule_triggers(load_stack("local").only_pool) == []


def _peak_policy():
    from frontier.config.schema import LocalAutoscaler
    from frontier.targets.local.autoscaler import Policy

    timing = LocalAutoscaler(interval_s=1, scale_out_after_s=5, scale_in_after_s=10, cooldown_s=3)
    schedule = Schedule(timezone="America/New_York", windows=(ScheduleWindow(**{**PEAK, "min_size": 3}),))
    return Policy(
        target_queue_depth=4, min_size=1, max_size=4, max_concurrency=8,
        scale_in_utilisation=0.5,
        timing=timing,
        schedule=schedule,
    )


# Thursday 2026-12-03, 09:00 and 20:00 in New York (UTC-5).
IN_THE_PEAK = datetime(2026, 12, 3, 14, 0, tzinfo=UTC).timestamp()
AFTER_THE_PEAK = datetime(2026, 12, 4, 1, 0, tzinfo=UTC).timestamp()


def test_the_local_autoscaler_raises_a_group_to_the_windows_floor_at_once():
    from frontier.targets.local.autoscaler import Decider, Observation

    decider = Decider(_peak_policy())
    decision = decider.feed(Observation(0.0, hosts=1, waiting=0, running=0, wall=IN_THE_PEAK))
    assert decision is not None and (decision.current, decision.desired) == (1, 3)
    assert "schedule window raises the floor to 3" in decision.reason
    assert decider.feed(Observation(0.0, hosts=1, waiting=0, running=0, wall=AFTER_THE_PEAK)) is None


def test_the_local_autoscaler_never_scales_in_below_the_windows_floor():
    from frontier.targets.local.autoscaler import Decider, Observation

    decider = Decider(_peak_policy())
    idle = [
        decider.feed(Observation(float(t), hosts=3, waiting=0, running=0, wall=IN_THE_PEAK + t))
        for t in range(30)
    ]
    assert [d for d in idle if d is not None] == []
    decider = Decider(_peak_policy())
    after = [
        decider.feed(Observation(float(t), hosts=3, waiting=0, running=0, wall=AFTER_THE_PEAK + t))
        for t in range(30)
    ]
    assert [(d.current, d.desired) for d in after if d is not None][:1] == [(3, 2)]
