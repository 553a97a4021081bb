"""Monitoring: alarms against the stack's SLOs and the hosts' resources, one topic per severity with
the stack's routes, log groups, a dashboard with every target's panels."""

from __future__ import annotations

import base64
import json

import pytest
import yaml
from frontier_hostside.names import (
    GATEWAY_5XX_CW_METRIC,
    GATEWAY_NODE_GROUP,
    GATEWAY_REQUESTS_CW_METRIC,
    RESTARTS_CW_METRIC,
)
from infra_mocks import Graph, run_program
from test_gateway_nodes import gated  # noqa: F401 - fixture

from frontier.config.schema import ALARM_SEVERITIES, NodeGroup, Settings
from frontier.render.dashboards import resource_panels
from frontier.targets import load_stack
from infra.host_tools import host_tools
from infra.monitoring import GATEWAY_CPU_PERCENT

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
TOPIC = "aws:sns/topic:Topic"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"


def monitoring_alarms(graph):
    """The stack's alarms (infra/monitoring.py); a node group's scaling alarms act on its policies."""
    return [a for a in graph.of_type(ALARM) if "frontier:monitoring:Monitoring" in a.parent_types]


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


PUBLISHED_BY_BOOTSTRAP = {"QueueDepth", "RunningRequests", "EndToEndLatency", RESTARTS_CW_METRIC}


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
    # One period spans the window: two restarts ten minutes apart (a long back-off) still fire.
    assert restarts["period"] == 600 and restarts["evaluationPeriods"] == 1


def test_every_runtime_alarm_reads_a_series_the_hosts_publish(graph):
    published = published_series(graph)
    runtime_alarms = [
        a.inputs
        for a in monitoring_alarms(graph)
        if a.inputs.get("namespace") == "Frontier/Runtime"
        and a.inputs["metricName"] in PUBLISHED_BY_BOOTSTRAP
    ]
    assert len(runtime_alarms) == 3
    for a in runtime_alarms:
        assert (a["namespace"], a["metricName"], tuple(sorted(a["dimensions"].items()))) in published
    others = [
        a.inputs for a in monitoring_alarms(graph) if a.inputs.get("namespace") not in (None, "Frontier/Runtime")
    ]
    assert {a["namespace"] for a in others} == {"AWS/ApplicationELB"}  # AWS publishes these itself


def alarm_name(graph, alarm):
    return alarm.inputs["name"].removeprefix(f"frontier-{graph.stack}-")


def severity_of(graph, alarm):
    """The table's severity of a CloudWatch alarm (per node group ones end in the group's name)."""
    name = alarm_name(graph, alarm)
    for group in graph.settings.node_groups:
        name = name.removesuffix(f"-{group.name}")
    return ALARM_SEVERITIES[name]


def topics(graph):
    return {t.inputs["name"].removeprefix(f"frontier-{graph.stack}-"): t for t in graph.of_type(TOPIC)}


def test_there_is_one_encrypted_topic_per_severity(graph):
    found = topics(graph)
    assert set(found) == {"page", "warn", "info"}
    assert all(t.inputs["kmsMasterKeyId"] == graph.outputs["kms_key_arn"] for t in found.values())


def test_every_alarm_notifies_its_severitys_topic_when_it_fires_and_when_it_recovers(graph):
    arns = {severity: t.outputs["arn"] for severity, t in topics(graph).items()}
    alarms = monitoring_alarms(graph)
    assert {severity_of(graph, a) for a in alarms} == {"page", "warn", "info"}
    for a in alarms:
        topic = arns[severity_of(graph, a)]
        # OK actions too: a recovered alarm says so on the same topic, and a page clears itself.
        assert a.inputs["alarmActions"] == [topic] and a.inputs["okActions"] == [topic]
        # A probe that publishes nothing does not run: that is its alarm's failure too.
        missing = "breaching" if alarm_name(graph, a) == "probe-failing" else "notBreaching"
        assert a.inputs["treatMissingData"] == missing


def test_the_stack_output_alarm_topic_is_the_page_topic(graph):
    assert graph.outputs["alarm_topic_arn"] == topics(graph)["page"].outputs["arn"]


def test_the_page_topic_mails_the_stacks_on_call_address(graph):
    page = topics(graph)["page"].outputs["arn"]
    mails = [
        s.inputs
        for s in graph.of_type(SUBSCRIPTION)
        if s.inputs["topic"] == page and s.inputs["protocol"] == "email"
    ]
    expected = graph.settings.alert_route("page").emails
    assert expected and sorted(m["endpoint"] for m in mails) == sorted(expected)


@pytest.fixture(scope="module")
def routed() -> Graph:
    """prod with routes for every severity (mail, SQS, HTTPS) and two alarms moved to other severities."""
    prod = load_stack("prod")
    alerts = prod.alerts.model_validate(
        {
            "routes": {
                "page": {"emails": ["oncall@frontier.example"], "sqs_queue_arns": [QUEUE]},
                "warn": {"https_endpoints": ["https://hooks.frontier.example/warn"]},
                "info": {"emails": ["ops-log@frontier.example"]},
            },
            "severities": {"queue-depth": "page", "5xx-rate": "warn"},
        }
    )
    return run_program(prod.model_copy(update={"alerts": alerts}))


QUEUE = "arn:aws:sqs:us-east-1:123456789012:frontier-prod-page"


def test_each_severitys_route_subscribes_to_its_topic_only(routed):
    graph = routed
    by_arn = {t.outputs["arn"]: name for name, t in topics(graph).items()}
    subscribed = {
        (by_arn[s.inputs["topic"]], s.inputs["protocol"], s.inputs["endpoint"])
        for s in graph.of_type(SUBSCRIPTION)
    }
    assert subscribed == {
        ("page", "email", "oncall@frontier.example"),
        ("page", "sqs", QUEUE),
        ("warn", "https", "https://hooks.frontier.example/warn"),
        ("info", "email", "ops-log@frontier.example"),
    }


def test_the_stack_moves_an_alarm_to_another_severitys_topic(routed):
    graph = routed
    arns = {severity: t.outputs["arn"] for severity, t in topics(graph).items()}
    assert alarm(graph, "queue-depth")["alarmActions"] == [arns["page"]]  # warn by default
    assert alarm(graph, "5xx-rate")["okActions"] == [arns["warn"]]  # page by default
    assert alarm(graph, "p99-latency")["alarmActions"] == [arns["page"]]  # untouched


def test_log_groups_are_encrypted_with_retention_under_the_stacks_prefix(graph):
    expected_days = 90 if graph.stack == "prod" else 30
    functions = {f.inputs["name"] for f in graph.of_type("aws:lambda/function:Function")}
    for group in graph.of_type("aws:cloudwatch/logGroup:LogGroup"):
        # A Lambda function writes where Lambda puts it: /aws/lambda/<function>.
        prefixes = (f"/frontier/{graph.stack}/", *(f"/aws/lambda/{f}" for f in functions))
        assert group.inputs["name"].startswith(prefixes)
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


# --- resource metrics and their alarms --------------------------------------------------------------


def agent_config(graph, group):
    [config] = [
        o.inputs["content"]
        for o in graph.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
        if o.inputs["key"].endswith(f"/host/{group}/cloudwatch-agent.json")
    ]
    return json.loads(config)


def test_the_cloudwatch_agent_collects_host_process_and_gpu_metrics_under_the_runtimes_dimensions(graph):
    group = graph.settings.serving_group.name
    metrics = agent_config(graph, group)["metrics"]
    collected = metrics["metrics_collected"]
    assert set(collected) == {"cpu", "mem", "disk", "net", "procstat", "nvidia_gpu"}
    assert set(collected["nvidia_gpu"]["measurement"]) >= {
        "utilization_gpu",
        "memory_used",
        "memory_total",
        "temperature_gpu",
        "power_draw",
    }
    assert collected["disk"]["resources"] == ["/var/cache/frontier"]  # the weights cache's mount
    ours = {"Stack": graph.stack, "NodeGroup": group}
    sections = [collected[k] for k in ("cpu", "mem", "disk", "net", "nvidia_gpu")] + collected["procstat"]
    assert all(section["append_dimensions"] == ours for section in sections)
    # Rolled up over the group's hosts: the series the alarms and the dashboard read.
    assert metrics["aggregation_dimensions"] == [["Stack", "NodeGroup"]]


def test_the_agent_publishes_in_the_namespace_the_runtime_hosts_role_may_write(graph):
    namespace = agent_config(graph, graph.settings.serving_group.name)["metrics"]["namespace"]
    policy = json.loads(
        graph.one("aws:iam/rolePolicy:RolePolicy", f"{graph.stack}-iam-runtime").inputs["policy"]
    )
    put = next(s for s in policy["Statement"] if s["Sid"] == "PutRuntimeMetrics")
    assert put["Condition"]["StringEquals"]["cloudwatch:namespace"] == namespace


def with_cpu_group(settings: Settings) -> tuple[Settings, NodeGroup]:
    cpu = settings.serving_group.model_copy(
        update={"name": "cpu", "accelerator": "cpu", "instance_type": "c7i.4xlarge"}
    )
    return settings.model_copy(update={"node_groups": (*settings.node_groups, cpu)}), cpu


def test_the_nvidia_gpu_section_is_rendered_for_gpu_groups_only():
    settings, cpu = with_cpu_group(load_stack("prod"))
    for group in settings.node_groups:
        collected = json.loads(host_tools(settings, group)["cloudwatch-agent.json"])["metrics"][
            "metrics_collected"
        ]
        assert ("nvidia_gpu" in collected) == (group.accelerator == "gpu"), group.name
        assert {"cpu", "mem", "disk", "net", "procstat"} <= set(collected)


def test_gpu_memory_alarms_when_the_fullest_gpu_passes_halfway_from_the_runtimes_claim_to_full(graph):
    group = graph.settings.serving_group.name
    gpu = alarm(graph, f"gpu-memory-{group}")
    claim = graph.settings.runtime.gpu_memory_utilization
    assert gpu["threshold"] == pytest.approx((1 + claim) / 2)
    queries = {q["id"]: q for q in gpu["metricQueries"]}
    assert queries["gpumemory"]["expression"] == "used / total"
    assert {queries[i]["metric"]["metricName"] for i in ("used", "total")} == {
        "nvidia_smi_memory_used",
        "nvidia_smi_memory_total",
    }
    assert all(
        queries[i]["metric"]["stat"] == "Maximum"
        and queries[i]["metric"]["dimensions"] == {"Stack": graph.stack, "NodeGroup": group}
        for i in ("used", "total")
    )


def test_host_memory_and_cache_disk_alarm_on_the_agents_percentages(graph):
    group = graph.settings.serving_group.name
    memory, disk = alarm(graph, f"host-memory-{group}"), alarm(graph, f"cache-disk-{group}")
    assert (memory["metricName"], memory["threshold"]) == ("mem_used_percent", 90)
    assert (disk["metricName"], disk["threshold"]) == ("disk_used_percent", 85)
    assert memory["statistic"] == disk["statistic"] == "Maximum"  # the fullest host of the group


RESOURCE_ALARMS = ("host-memory", "cache-disk", "gpu-memory", "gpu-temperature")


def test_every_resource_alarm_reads_a_series_the_agent_collects(graph):
    group = graph.settings.serving_group.name
    collected = agent_config(graph, group)["metrics"]["metrics_collected"]
    # The agent names a series <plugin>_<measurement>, its NVIDIA plugin's nvidia_smi_<measurement>.
    agent_series = {
        f"{'nvidia_smi' if section == 'nvidia_gpu' else section}_{measurement}"
        for section, body in collected.items()
        if section != "procstat"
        for measurement in body["measurement"]
    }
    resource = [
        graph.one(ALARM, f"{graph.stack}-monitoring-{name}-{group}").inputs for name in RESOURCE_ALARMS
    ]
    for a in resource:
        queries = [q["metric"] for q in a.get("metricQueries", []) if "metric" in q]
        for series in queries or [a]:
            assert series["namespace"] == "Frontier/Runtime"
            assert series["metricName"] in agent_series, (a["name"], series["metricName"])


def test_the_dashboard_has_every_resource_panel_of_the_grafana_dashboard(graph):
    body = json.loads(graph.one("aws:cloudwatch/dashboard:Dashboard").inputs["dashboardBody"])
    titles = {w["properties"]["title"] for w in body["widgets"]}
    assert {p.title for p in resource_panels()} <= titles
    gpu = next(w for w in body["widgets"] if w["properties"]["title"] == "GPU utilisation (%)")
    assert [
        "Frontier/Runtime",
        "nvidia_smi_utilization_gpu",
        "Stack",
        graph.stack,
        "NodeGroup",
        graph.settings.serving_group.name,
        {"stat": "Average"},
    ] in gpu["properties"]["metrics"]


# --- a stack whose ALB fronts the gateway's own hosts (tests/infra/test_gateway_nodes.py) -----------


def _gateway_alarm(gated, key):  # noqa: F811
    return gated.one(ALARM, f"dev-monitoring-{key}").inputs


def test_the_gateway_alarms_on_its_own_5xx_rate_from_what_its_hosts_publish(gated):  # noqa: F811
    rate = _gateway_alarm(gated, "gateway-5xx-rate")
    assert rate["threshold"] == gated.settings.slo.error_rate
    series = {q["id"]: q["metric"] for q in rate["metricQueries"] if "metric" in q}
    assert {(m["namespace"], m["metricName"], m["stat"]) for m in series.values()} == {
        ("Frontier/Runtime", GATEWAY_5XX_CW_METRIC, "Sum"),
        ("Frontier/Runtime", GATEWAY_REQUESTS_CW_METRIC, "Sum"),
    }
    # The dimensions the gateway's publisher puts them under (frontier_hostside/bootstrap.py).
    assert all(m["dimensions"] == {"Stack": "dev", "NodeGroup": GATEWAY_NODE_GROUP} for m in series.values())
    [returned] = [q for q in rate["metricQueries"] if q["returnData"]]
    assert returned["expression"] == "IF(answered > 0, FILL(errors, 0) / answered, 0)"


def test_any_gateway_host_unhealthy_in_the_target_group_alarms(gated):  # noqa: F811
    unhealthy = _gateway_alarm(gated, "gateway-unhealthy-hosts")
    assert (unhealthy["namespace"], unhealthy["metricName"]) == ("AWS/ApplicationELB", "UnHealthyHostCount")
    alb, tg = arn_suffixes(gated)
    assert unhealthy["dimensions"] == {"LoadBalancer": alb, "TargetGroup": tg}
    assert unhealthy["threshold"] == 0


def test_a_busy_gateway_host_alarms_on_the_agents_cpu_series(gated):  # noqa: F811
    cpu = _gateway_alarm(gated, "gateway-cpu")
    assert (cpu["namespace"], cpu["metricName"], cpu["statistic"]) == (
        "Frontier/Runtime",
        "cpu_usage_active",
        "Maximum",
    )
    assert cpu["dimensions"] == {"Stack": "dev", "NodeGroup": GATEWAY_NODE_GROUP}
    assert cpu["threshold"] == GATEWAY_CPU_PERCENT


def test_gateway_alarms_notify_the_topic_of_their_own_severity(gated):  # noqa: F811
    arns = {severity: t.outputs["arn"] for severity, t in topics(gated).items()}
    for key, severity in (
        ("gateway-5xx-rate", "page"),
        ("gateway-unhealthy-hosts", "page"),
        ("gateway-cpu", "warn"),
    ):
        assert gated.settings.alerts.severity(key) == severity
        found = _gateway_alarm(gated, key)
        assert found["alarmActions"] == [arns[severity]] and found["okActions"] == [arns[severity]]


def test_a_stack_without_a_gateway_has_no_gateway_alarms_or_log_group(dev):
    assert not [a for a in monitoring_alarms(dev) if "gateway" in a.inputs["name"]]
    assert "/frontier/dev/gateway" not in {
        g.inputs["name"] for g in dev.of_type("aws:cloudwatch/logGroup:LogGroup")
    }
