"""Monitoring: alarms against the stack's SLOs, log groups, the alarm topic, a dashboard."""

from __future__ import annotations

import base64
import json

import yaml
from frontier_hostside.names import RESTARTS_CW_METRIC

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


def runtime_dims(graph):
    return {"Stack": graph.stack, "NodeGroup": graph.settings.serving_group.name}


def test_the_latency_alarm_watches_the_p99_of_whole_requests_not_time_to_first_byte(graph):
    latency = alarm(graph, "p99-latency")
    assert (latency["namespace"], latency["metricName"]) == ("Frontier/Runtime", "EndToEndLatency")
    assert latency["extendedStatistic"] == "p99"
    assert latency["threshold"] == graph.settings.slo.p99_latency_ms  # milliseconds, as published
    assert latency["dimensions"] == runtime_dims(graph)


def test_unhealthy_hosts_alarm_only_beyond_what_a_rollout_takes_out(graph):
    unhealthy = alarm(graph, "unhealthy-hosts")
    rollout = graph.settings.rollout
    assert (unhealthy["metricName"], unhealthy["statistic"], unhealthy["threshold"]) == (
        "UnHealthyHostCount",
        "Maximum",
        max(rollout.batch_size, rollout.canary_hosts),
    )
    assert unhealthy["threshold"] >= 1  # a host out for its rollout step never pages
    assert unhealthy["comparisonOperator"] == "GreaterThanThreshold"


def test_the_queue_depth_alarm_reads_the_runtimes_metric_against_the_stacks_limit(graph):
    queue = alarm(graph, "queue-depth")
    assert (queue["namespace"], queue["metricName"]) == ("Frontier/Runtime", "QueueDepth")
    assert queue["dimensions"] == runtime_dims(graph)
    assert queue["threshold"] == graph.settings.monitoring.queue_depth_alarm


def published_series(graph):
    """(namespace, metric, dimensions) the hosts' bootstrap publishes, read from the rendered node.env."""
    lt = graph.one(
        "aws:ec2/launchTemplate:LaunchTemplate", f"{graph.stack}-{graph.settings.serving_group.name}-lt"
    )
    user_data = base64.b64decode(lt.inputs["userData"]).decode()
    env_text = next(
        f["content"]
        for f in yaml.safe_load(user_data)["write_files"]
        if f["path"] == "/etc/frontier/node.env"
    )
    env = dict(line.split("=", 1) for line in env_text.splitlines() if line)
    dims = {"Stack": env["FRONTIER_STACK"], "NodeGroup": env["FRONTIER_NODE_GROUP"]}
    names = (
        env["FRONTIER_QUEUE_METRIC"],
        env["FRONTIER_RUNNING_METRIC"],
        env["FRONTIER_LATENCY_METRIC"],
        RESTARTS_CW_METRIC,  # the bootstrap's own name, not passed in node.env
    )
    return {(env["FRONTIER_METRIC_NAMESPACE"], name, tuple(sorted(dims.items()))) for name in names}


def test_a_crash_looping_runtime_raises_the_restarts_alarm(graph):
    restarts = alarm(graph, "runtime-restarts")
    assert restarts["metricName"] == "RuntimeRestarts" and restarts["statistic"] == "Sum"
    assert restarts["threshold"] >= 1  # one restart is a host healing itself


def test_every_runtime_alarm_reads_a_series_the_hosts_publish(graph):
    published = published_series(graph)
    runtime_alarms = [
        a.inputs for a in graph.of_type(ALARM) if a.inputs.get("namespace") == "Frontier/Runtime"
    ]
    assert len(runtime_alarms) == 3
    for a in runtime_alarms:
        assert (a["namespace"], a["metricName"], tuple(sorted(a["dimensions"].items()))) in published
    others = [
        a.inputs for a in graph.of_type(ALARM) if a.inputs.get("namespace") not in (None, "Frontier/Runtime")
    ]
    assert {a["namespace"] for a in others} == {"AWS/ApplicationELB"}  # AWS publishes these itself


def test_every_alarm_notifies_the_topic_and_ignores_missing_data(graph):
    topic = graph.outputs["alarm_topic_arn"]
    alarms = graph.of_type(ALARM)
    assert len(alarms) == 5
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
    group = graph.settings.serving_group.name
    assert [
        "Frontier/Runtime",
        "QueueDepth",
        "Stack",
        graph.stack,
        "NodeGroup",
        group,
        {"stat": "Maximum"},
    ] in series
    assert {m[3] for m in series if m[0] == "AWS/AutoScaling"} == set(graph.outputs["asg_names"])


def test_the_cloudwatch_agent_ships_host_logs_into_the_log_groups_the_program_creates(graph):
    group = graph.settings.serving_group.name
    [config] = [
        o.inputs["content"]
        for o in graph.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
        if o.inputs["key"].endswith(f"/host/{group}/cloudwatch-agent.json")
    ]
    shipped = json.loads(config)["logs"]["logs_collected"]["files"]["collect_list"]
    created = {g.inputs["name"] for g in graph.of_type("aws:cloudwatch/logGroup:LogGroup")}
    names = {f["log_group_name"] for f in shipped}
    assert names == {f"/frontier/{graph.stack}/runtime", f"/frontier/{graph.stack}/cloud-init"}
    assert names <= created  # (the VPC's flow logs have a group of their own)
    paths = {f["file_path"] for f in shipped}
    assert "/var/lib/docker/containers/*/*-json.log" in paths  # the runtime container's output
    assert "/var/log/frontier-bootstrap.log" in paths  # why a host continued or abandoned
    # The runtime role may write exactly there.
    policy = json.loads(
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-runtime").inputs["policy"]
    )
    logs = next(s for s in policy["Statement"] if s["Sid"] == "WriteItsLogs")
    assert all(f":log-group:/frontier/{graph.stack}/*" in arn for arn in logs["Resource"])
