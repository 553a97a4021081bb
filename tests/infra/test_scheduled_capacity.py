"""The serving group's schedule on EC2: scheduled actions that raise and restore the floor, and a
predictive scaling policy on what the hosts publish (Pulumi mocks: no AWS API here)."""

from __future__ import annotations

from frontier_hostside.names import CLOUDWATCH_NAMESPACE, RUNNING_REQUESTS_METRIC

SCHEDULE = "aws:autoscaling/schedule:Schedule"
POLICY = "aws:autoscaling/policy:Policy"


def test_a_window_raises_the_floor_at_its_start_and_gives_the_groups_own_back_at_its_end(prod):
    actions = {r.inputs["scheduledActionName"]: r.inputs for r in prod.of_type(SCHEDULE)}
    assert set(actions) == {"weekday-peak-start", "weekday-peak-end"}
    start, end = actions["weekday-peak-start"], actions["weekday-peak-end"]
    assert (start["recurrence"], start["timeZone"], start["minSize"]) == (
        "30 8 * * 1,2,3,4,5",
        "America/New_York",
        8,
    )
    assert (end["recurrence"], end["minSize"]) == ("0 19 * * 1,2,3,4,5", prod.settings.serving_group.min_size)
    # Only the floor moves: -1 leaves the desired capacity and the maximum as they are, so the
    # queue-depth policy keeps scaling above the floor.
    assert start["desiredCapacity"] == start["maxSize"] == -1


def test_the_forecast_is_a_predictive_policy_on_the_running_requests_hosts_publish(prod):
    policy = next(r.inputs for r in prod.of_type(POLICY) if r.inputs["policyType"] == "PredictiveScaling")
    config = policy["predictiveScalingConfiguration"]
    assert config["mode"] == "ForecastAndScale" and config["schedulingBufferTime"] == "900"
    spec = config["metricSpecification"]
    assert spec["targetValue"] == 200
    load = spec["customizedLoadMetricSpecification"]["metricDataQueries"][0]["metricStat"]
    assert load["stat"] == "Sum"
    assert (load["metric"]["namespace"], load["metric"]["metricName"]) == (
        CLOUDWATCH_NAMESPACE,
        RUNNING_REQUESTS_METRIC,
    )


def test_a_group_without_a_schedule_gets_no_scheduled_action(staging):
    assert staging.of_type(SCHEDULE) == []
