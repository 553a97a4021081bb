"""Monitoring: alarms against the stack's SLOs, log groups, the alarm topic, a dashboard."""

from __future__ import annotations

import json

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"


def alarm(graph, key):
    return graph.one(ALARM, f"{graph.stack}-monitoring-{key}").inputs


def arn_suffixes(graph):
    return (
        graph.one("aws:lb/loadBalancer:LoadBalancer").outputs["arnSuffix"],
        graph.one("aws:lb/targetGroup:TargetGroup").outputs["arnSuffix"],
    )


def test_the_5xx_rate_alarm_divides_errors_by_requests_against_the_slo(graph):
    rate = alarm(graph, "5xx-rate")
    assert rate["threshold"] == graph.settings.slo.error_rate
    queries = {q["id"]: q for q in rate["metricQueries"]}
    alb, _ = arn_suffixes(graph)
    assert {q["metric"]["metricName"] for q in queries.values() if "metric" in q} == {
        "HTTPCode_ELB_5XX_Count",
        "HTTPCode_Target_5XX_Count",
        "RequestCount",
    }
    assert all(q["metric"]["dimensions"] == {"LoadBalancer": alb} for q in queries.values() if "metric" in q)
    [returned] = [q for q in queries.values() if q["returnData"]]
    assert returned["expression"] == "(FILL(elb5xx, 0) + FILL(target5xx, 0)) / requests"


def test_the_latency_alarm_watches_target_p99_against_the_slo_in_seconds(graph):
    latency = alarm(graph, "p99-latency")
    assert latency["metricName"] == "TargetResponseTime" and latency["extendedStatistic"] == "p99"
    assert latency["threshold"] == graph.settings.slo.p99_latency_ms / 1000
    alb, tg = arn_suffixes(graph)
    assert latency["dimensions"] == {"LoadBalancer": alb, "TargetGroup": tg}


def test_any_unhealthy_host_raises_an_alarm(graph):
    unhealthy = alarm(graph, "unhealthy-hosts")
    assert (unhealthy["metricName"], unhealthy["statistic"], unhealthy["threshold"]) == (
        "UnHealthyHostCount",
        "Maximum",
        0,
    )
    assert unhealthy["comparisonOperator"] == "GreaterThanThreshold"


def test_the_queue_depth_alarm_reads_the_runtimes_metric_against_the_stacks_limit(graph):
    queue = alarm(graph, "queue-depth")
    assert (queue["namespace"], queue["metricName"]) == ("Frontier/Runtime", "QueueDepth")
    assert queue["dimensions"] == {"Stack": graph.stack}
    assert queue["threshold"] == graph.settings.monitoring.queue_depth_alarm


def test_every_alarm_notifies_the_topic_and_ignores_missing_data(graph):
    topic = graph.outputs["alarm_topic_arn"]
    alarms = graph.of_type(ALARM)
    assert len(alarms) == 4
    for a in alarms:
        assert a.inputs["alarmActions"] == [topic] and a.inputs["okActions"] == [topic]
        assert a.inputs["treatMissingData"] == "notBreaching"


def test_the_alarm_topic_is_encrypted_and_mails_the_stacks_address(graph):
    topic = graph.one("aws:sns/topic:Topic").inputs
    assert topic["kmsMasterKeyId"] == graph.outputs["kms_key_arn"]
    subscription = graph.one("aws:sns/topicSubscription:TopicSubscription").inputs
    assert (subscription["protocol"], subscription["endpoint"]) == (
        "email",
        graph.settings.monitoring.alarm_email,
    )


def test_log_groups_are_encrypted_with_retention_under_the_stacks_prefix(graph):
    expected_days = 90 if graph.stack == "prod" else 30
    for group in graph.of_type("aws:cloudwatch/logGroup:LogGroup"):
        assert group.inputs["name"].startswith(f"/frontier/{graph.stack}/")
        assert group.inputs["kmsKeyId"] == graph.outputs["kms_key_arn"]
        assert group.inputs["retentionInDays"] == expected_days


def test_the_dashboard_shows_the_stacks_load_balancer_queue_and_hosts(graph):
    dashboard = graph.one("aws:cloudwatch/dashboard:Dashboard").inputs
    body = json.loads(dashboard["dashboardBody"])
    series = [m for w in body["widgets"] for m in w["properties"]["metrics"]]
    alb, tg = arn_suffixes(graph)
    assert any(alb in m for m in series) and any(tg in m for m in series)
    assert ["Frontier/Runtime", "QueueDepth", "Stack", graph.stack, {"stat": "Maximum"}] in series
    assert {m[3] for m in series if m[0] == "AWS/AutoScaling"} == set(graph.outputs["asg_names"])
