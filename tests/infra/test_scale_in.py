"""A GPU group gives hosts back only when a replica fewer would carry what runs: at a steady load
the queue is empty, and that alone never scales in.

The alarm's metric math is evaluated here as CloudWatch would (``IF``, ``AND``, comparisons and
arithmetic over the query ids), from the expression the program sends.
"""

from __future__ import annotations

import re

import pytest
from infra_mocks import graph_for

from infra.scale_in import SCALE_IN_MINUTES, scale_in_expression

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
POLICY = "aws:autoscaling/policy:Policy"


def evaluate(expression: str, **values: float) -> float:
    """CloudWatch metric math's IF/AND/comparisons over scalar datapoints."""
    python = re.sub(r"\bAND\b", "and", expression)
    return float(eval(python, {"IF": lambda c, a, b: a if c else b}, dict(values)))  # noqa: S307


def scale_in_alarm(graph):
    [alarm] = [a for a in graph.of_type(ALARM) if a.name.endswith("-load-in")]
    return alarm


def expression_of(alarm) -> str:
    [query] = [q for q in alarm.inputs["metricQueries"] if q.get("returnData")]
    return query["expression"]


@pytest.mark.parametrize("stack", ["prod", "prod-multinode"])
def test_a_steady_load_with_an_empty_queue_keeps_every_replica(stack):
    graph = graph_for(stack)
    expression = expression_of(scale_in_alarm(graph))
    concurrency = graph.settings.runtime.max_concurrency
    # Four replicas each running 60 % of its concurrency: three would run 80 % (over the 50 % target).
    nodes = graph.settings.runtime.nodes_per_replica
    assert evaluate(expression, queue=0, running=0.6 * concurrency, hosts=4 * nodes) == 0


@pytest.mark.parametrize("stack", ["prod", "prod-multinode"])
def test_a_light_load_gives_a_replica_back(stack):
    graph = graph_for(stack)
    expression = expression_of(scale_in_alarm(graph))
    concurrency, nodes = graph.settings.runtime.max_concurrency, graph.settings.runtime.nodes_per_replica
    # 4 replicas at 20 %: three would run at 27 %, under the group's scale_in_utilisation of 50 %.
    assert evaluate(expression, queue=0, running=0.2 * concurrency, hosts=4 * nodes) == 1


def test_anything_waiting_or_a_last_replica_is_never_given_back():
    expression = scale_in_expression(nodes=2, room_per_replica=32)
    assert evaluate(expression, queue=0.5, running=0, hosts=8) == 0
    assert evaluate(expression, queue=0, running=0, hosts=2) == 0


@pytest.mark.parametrize(("stack", "step"), [("prod", -1), ("prod-multinode", -2)])
def test_the_alarm_removes_one_replica_after_ten_quiet_minutes(stack, step):
    graph = graph_for(stack)
    alarm = scale_in_alarm(graph)
    assert (alarm.inputs["evaluationPeriods"], alarm.inputs["datapointsToAlarm"]) == (SCALE_IN_MINUTES,) * 2
    assert alarm.inputs["treatMissingData"] == "notBreaching"  # no figures is no evidence of no load
    [policy] = [p for p in graph.of_type(POLICY) if p.name.endswith("-load-in")]
    assert alarm.inputs["alarmActions"] == [policy.outputs["arn"]]
    assert policy.inputs["stepAdjustments"] == [{"scalingAdjustment": step, "metricIntervalLowerBound": "0"}]


def test_the_alarm_reads_what_the_hosts_publish_and_the_groups_in_service_count():
    alarm = scale_in_alarm(graph_for("prod"))
    queries = {q["id"]: q for q in alarm.inputs["metricQueries"]}
    assert queries["queue"]["metric"]["metricName"] == "QueueDepth"
    assert queries["running"]["metric"]["metricName"] == "RunningRequests"
    hosts = queries["hosts"]["metric"]
    assert (hosts["namespace"], hosts["metricName"]) == ("AWS/AutoScaling", "GroupInServiceInstances")
