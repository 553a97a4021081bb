"""The named alarms (frontier/alarms.py) are the same on every target, read from what each renders:
the EC2 program run as ``pulumi up`` runs it (a fresh interpreter in the program's folder, the
language host's sequence, mocks for the engine and AWS), the Kubernetes stack's manifests (validated
strictly), and the local stack's evaluator. Then the synthetic probe's EC2 resources under mocks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from test_language_host import launch, pulumi_config

from frontier.alarms import HOSTS, NAMED_ALARMS, PROBE_FAILED_MINUTES, probe_job_name
from frontier.targets import load_stack
from frontier.targets.kubernetes.manifests import render_workload
from frontier.targets.local.alarms import local_watches

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
DIGEST = "sha256:" + "ab" * 32
# The Prometheus Operator's objects against their pinned schemas; core objects strictly.
SCHEMAS = Path(__file__).resolve().parents[1] / "kubernetes" / "schemas"
CRD_SCHEMAS = {
    "ScaledObject": "keda-2.16-scaledobject.json",
    "ServiceMonitor": "prometheus-operator-0.80-servicemonitor.json",
    "PrometheusRule": "prometheus-operator-0.80-prometheusrule.json",
    "LeaderWorkerSet": "lws-0.10-leaderworkerset.json",
}
EC2_STACK, KUBERNETES_STACK, LOCAL_STACK = "prod", "eks-prod", "local"


def ec2_alarms(stack: str, tmp: Path) -> dict[str, str]:
    """The stack's CloudWatch alarms as the language host declares them: alarm -> its AWS name."""
    out = tmp / f"{stack}.json"
    done = launch(stack, pulumi_config(stack), out)
    assert done.returncode == 0, done.stderr[-4000:]
    prefix = f"frontier-{stack}-"
    return {
        name.removeprefix(prefix): name
        for kind, logical, name in json.loads(out.read_text())["named"]
        if kind == ALARM and logical.startswith(f"{stack}-monitoring-")
    }


def validate(manifest: dict, version: str) -> None:
    if manifest["kind"] in CRD_SCHEMAS:
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[manifest["kind"]]).read_text())
        jsonschema.validate(manifest, schema, cls=jsonschema.Draft202012Validator)
    else:
        kubernetes_validate.validate(manifest, version, strict=True)


def kubernetes_alarms(stack: str) -> dict[str, str]:
    """The stack's PrometheusRule alerts, from its manifests (each validated): alarm -> alert."""
    settings = load_stack(stack)
    objects = render_workload(settings, DIGEST).all()
    for manifest in objects:
        validate(manifest.to_dict(), settings.kubernetes.cluster.version)
    [rule] = [o for o in objects if o.kind == "PrometheusRule"]
    return {r["labels"]["alarm"]: r["alert"] for g in rule.to_dict()["spec"]["groups"] for r in g["rules"]}


def test_every_target_raises_the_same_named_alarms(tmp_path):
    named = list(NAMED_ALARMS)
    ec2 = ec2_alarms(EC2_STACK, tmp_path)
    kubernetes = kubernetes_alarms(KUBERNETES_STACK)
    local = local_watches(load_stack(LOCAL_STACK)).names()
    table = {alarm: (ec2.get(alarm), kubernetes.get(alarm), alarm in local) for alarm in named}
    print("\nalarm | EC2 CloudWatch alarm | Kubernetes alert | local watch")
    for alarm, (on_ec2, on_kubernetes, on_local) in table.items():
        print(f"{alarm} | {on_ec2} | {on_kubernetes} | {on_local}")
    assert named == [
        "ttft",
        "kv-cache-full",
        "structured-output-failures",
        "runtime-down",
        "runtime-restarts",
        "probe-failing",
    ]
    assert all(on_ec2 == f"frontier-{EC2_STACK}-{alarm}" for alarm, (on_ec2, _, _) in table.items()), table
    assert all(on_kubernetes for _, on_kubernetes, _ in table.values()), table
    assert sorted(local) == sorted(named)


def test_each_model_has_its_probe_cron_job_run_as_its_pools_identity():
    settings = load_stack("eks-gateway")
    objects = render_workload(settings, DIGEST).all()
    jobs = {o.name: o.to_dict() for o in objects if o.kind == "CronJob"}
    assert len(settings.pools) > 1 and len(jobs) == len(settings.pools)
    accounts = {o.name for o in objects if o.kind == "ServiceAccount"}
    for pool in settings.pools:
        [(name, job)] = [
            (n, j)
            for n, j in jobs.items()
            if {"name": "FRONTIER_PROBE_MODELS", "value": pool.name}
            in j["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["env"]
        ]
        pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert name.startswith(f"frontier-{settings.stack}-probe-") and len(name) <= 52
        assert pod["serviceAccountName"] in accounts
        assert job["spec"]["schedule"] == "*/1 * * * *" and job["spec"]["concurrencyPolicy"] == "Forbid"
        assert re.search(NAMED_ALARMS["probe-failing"].prometheus(settings, HOSTS).expr.split('"')[1], name)


def test_each_target_compares_the_same_threshold_from_the_stacks_settings(prod):
    settings = prod.settings
    for alarm in NAMED_ALARMS.values():
        condition = alarm.cloudwatch(settings)
        inputs = prod.one(ALARM, f"{prod.stack}-monitoring-{alarm.name}").inputs
        assert inputs["threshold"] == condition.threshold
        assert inputs["comparisonOperator"] == condition.comparison
    assert prod.one(ALARM, "prod-monitoring-ttft").inputs["threshold"] == settings.slo.ttft_ms
    ttft_rule = NAMED_ALARMS["ttft"].prometheus(settings, HOSTS)
    assert ttft_rule.expr.endswith(f"> {settings.slo.ttft_ms / 1000}")  # seconds, as the histogram
    kv = prod.one(ALARM, "prod-monitoring-kv-cache-full").inputs
    assert kv["threshold"] == settings.monitoring.kv_usage_alarm and kv["statistic"] == "Maximum"


def test_the_structured_output_alarm_divides_failures_by_outputs_checked(prod):
    inputs = prod.one(ALARM, "prod-monitoring-structured-output-failures").inputs
    queries = {q["id"]: q for q in inputs["metricQueries"]}
    assert queries["failed"]["metric"]["metricName"] == "StructuredOutputFailures"
    assert queries["checked"]["metric"]["metricName"] == "StructuredOutputs"
    assert queries["rate"]["expression"] == "IF(checked > 0, FILL(failed, 0) / checked, 0)"
    assert inputs["threshold"] == prod.settings.slo.error_rate


def test_the_probe_alarm_fires_on_failed_or_missing_minutes_of_the_stacks_probe(prod):
    inputs = prod.one(ALARM, "prod-monitoring-probe-failing").inputs
    assert (inputs["metricName"], inputs["statistic"], inputs["dimensions"]) == (
        "ProbeSuccess",
        "Minimum",
        {"Stack": "prod"},
    )
    assert (inputs["comparisonOperator"], inputs["threshold"]) == ("LessThanThreshold", 1)
    assert inputs["evaluationPeriods"] == inputs["datapointsToAlarm"] == PROBE_FAILED_MINUTES
    assert inputs["treatMissingData"] == "breaching"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_schedule_runs_the_probe_lambda_every_minute_against_the_public_endpoint(stack, request):
    graph = request.getfixturevalue(stack)
    [function] = [
        f for f in graph.of_type("aws:lambda/function:Function") if f.inputs["name"] == probe_job_name(stack)
    ]
    env = function.inputs["environment"]["variables"]
    assert function.inputs["handler"] == "synthetic_probe.handler"
    assert env["FRONTIER_PROBE_ENDPOINT"] == graph.outputs["endpoint"]
    assert env["FRONTIER_PROBE_MODELS"] == ",".join(p.name for p in graph.settings.pools)
    assert env["FRONTIER_PROBE_KEY_SECRET"] == graph.outputs["api_keys_secret_arn"]
    assert set(function.inputs["code"].assets) == {
        "synthetic_probe.py",
        "frontier_hostside/__init__.py",
        "frontier_hostside/names.py",
        "frontier_hostside/probe.py",
    }
    [rule] = [
        r
        for r in graph.of_type("aws:cloudwatch/eventRule:EventRule")
        if r.inputs["name"] == probe_job_name(stack)
    ]
    assert rule.inputs["scheduleExpression"] == "rate(1 minute)"
    [target] = [
        t
        for t in graph.of_type("aws:cloudwatch/eventTarget:EventTarget")
        if t.inputs["rule"] == rule.inputs["name"]
    ]
    assert target.inputs["arn"] == function.outputs["arn"]
    [permission] = [
        p
        for p in graph.of_type("aws:lambda/permission:Permission")
        if p.inputs.get("sourceArn") == rule.outputs["arn"]
    ]
    assert permission.inputs["principal"] == "events.amazonaws.com"
    assert permission.inputs["function"] == function.outputs["name"]


def test_the_probes_role_publishes_in_the_runtimes_namespace_and_reads_only_its_key(prod):
    [policy] = [
        p for p in prod.of_type("aws:iam/rolePolicy:RolePolicy") if p.name == "prod-monitoring-probe-role"
    ]
    statements = {s["Sid"]: s for s in json.loads(policy.inputs["policy"])["Statement"]}
    assert statements["PublishTheProbesFigures"]["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": "Frontier/Runtime"}
    }
    assert statements["ReadTheProbesKey"]["Resource"] == prod.outputs["api_keys_secret_arn"]
    assert statements["DecryptTheProbesKey"]["Resource"] == prod.outputs["kms_key_arn"]
