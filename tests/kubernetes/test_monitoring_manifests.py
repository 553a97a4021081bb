"""The Prometheus stack's part of a Kubernetes stack: the DCGM exporter on GPU nodes, the resource
alerts, the routes by severity and the Grafana dashboard.

Core objects are validated with kubernetes-validate (strict: an unknown field fails); the CRD objects
against the pinned schemas in ``schemas/``. No API server runs here.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

from frontier.config.schema import ALARM_SEVERITIES, Settings
from frontier.errors import FrontierError
from frontier.render.dashboards import panels
from frontier.targets import load_stack
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes import monitoring

DIGEST = "sha256:" + "ab" * 32
SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator-0.80-servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheus-operator-0.80-prometheusrule.json",
    (
        "monitoring.coreos.com/v1alpha1",
        "AlertmanagerConfig",
    ): "prometheus-operator-0.80-alertmanagerconfig.json",
}


def validate(manifest: dict, version: str) -> None:
    key = (manifest["apiVersion"], manifest["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
        jsonschema.validate(manifest, schema, cls=jsonschema.Draft202012Validator)
    else:
        kubernetes_validate.validate(manifest, version, strict=True)


def with_alerts(settings: Settings, alerts: dict) -> Settings:
    return settings.model_copy(update={"alerts": settings.alerts.model_validate(alerts)})


def objects(settings: Settings) -> dict[str, dict]:
    return {o.kind: o.to_dict() for o in monitoring.monitoring_objects(settings)}


def test_every_monitoring_object_validates_strictly_for_the_clusters_version(eks_prod):
    found = monitoring.monitoring_objects(eks_prod)
    assert sorted(o.kind for o in found) == [
        "AlertmanagerConfig",
        "ConfigMap",
        "DaemonSet",
        "PrometheusRule",
        "Service",
        "ServiceMonitor",
    ]
    for manifest in found:
        validate(manifest.to_dict(), eks_prod.kubernetes.cluster.version)


def test_the_core_monitoring_objects_validate_for_every_version_the_settings_allow(eks_prod):
    """kubernetes.cluster.version allows 1.25-1.37: each accepts the DaemonSet, Service and ConfigMap."""
    core = [
        o.to_dict() for o in monitoring.monitoring_objects(eks_prod) if o.api_version in ("v1", "apps/v1")
    ]
    assert len(core) == 3
    for minor in range(25, 38):
        for manifest in core:
            kubernetes_validate.validate(manifest, f"1.{minor}", strict=True)


def test_the_alertmanager_schema_refuses_an_unknown_field(eks_prod):
    """Control: the pinned AlertmanagerConfig schema is strict."""
    config = objects(eks_prod)["AlertmanagerConfig"]
    config["spec"]["route"]["routes"][0]["severity"] = "page"
    with pytest.raises(jsonschema.ValidationError):
        validate(config, "1.33")


def test_the_dcgm_exporter_runs_on_every_gpu_pools_nodes_with_their_taints_tolerated(eks_prod):
    daemon = objects(eks_prod)["DaemonSet"]
    spec = daemon["spec"]["template"]["spec"]
    [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    [types] = term["matchExpressions"]
    pool = eks_prod.kubernetes.node_pools[0]
    assert (types["key"], types["values"]) == ("node.kubernetes.io/instance-type", list(pool.instance_types))
    assert {(t["key"], t["effect"]) for t in spec["tolerations"]} == {(t.key, t.effect) for t in pool.taints}
    [container] = spec["containers"]
    # Pinned by tag of NVIDIA's registry: a new exporter is a change of the code, never "latest".
    assert container["image"] == monitoring.DCGM_IMAGE and not container["image"].endswith(":latest")
    assert container["ports"][0]["containerPort"] == monitoring.DCGM_PORT
    # Outside the runtime's namespace, whose restricted pod security would refuse the host socket.
    assert daemon["metadata"]["namespace"] == eks_prod.kubernetes.monitoring.prometheus_namespace


def test_the_dcgm_service_monitor_scrapes_the_exporters_service(eks_prod):
    found = objects(eks_prod)
    monitor, service = found["ServiceMonitor"], found["Service"]
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"  # the operator's selector
    assert service["spec"]["selector"] == found["DaemonSet"]["spec"]["template"]["metadata"]["labels"]


def test_a_stack_without_gpu_pools_gets_no_dcgm_exporter(eks_prod):
    cpu_groups = tuple(g.model_copy(update={"accelerator": "cpu"}) for g in eks_prod.node_groups)
    settings = eks_prod.model_copy(update={"node_groups": cpu_groups})
    assert monitoring.dcgm_exporter(settings) == []


def test_every_alert_carries_its_alarm_name_and_the_severity_the_stack_gives_it(eks_prod):
    settings = with_alerts(
        eks_prod,
        {"routes": {"page": {"emails": ["oncall@frontier.example"]}}, "severities": {"gpu-memory": "page"}},
    )
    rules = [
        r
        for rule in (monitoring.prometheus_rule(settings, settings.only_pool), monitoring.resource_rule(settings))
        for g in rule.to_dict()["spec"]["groups"]
        for r in g["rules"]
    ]
    for r in rules:
        alarm = r["labels"]["alarm"]
        expected = "page" if alarm == "gpu-memory" else ALARM_SEVERITIES[alarm]
        assert r["labels"]["severity"] == expected, r["alert"]
        assert r["labels"]["stack"] == eks_prod.stack
    assert {"gpu-memory", "host-memory", "cache-disk", "runtime-down"} <= {
        r["labels"]["alarm"] for r in rules
    }


def test_alertmanager_routes_each_severity_of_this_stack_to_its_receivers_and_sends_recoveries(eks_prod):
    settings = with_alerts(
        eks_prod,
        {
            "routes": {
                "page": {
                    "emails": ["oncall@frontier.example"],
                    "https_endpoints": ["https://pager.frontier.example/in"],
                },
                "warn": {"emails": ["team@frontier.example"]},
            }
        },
    )
    spec = objects(settings)["AlertmanagerConfig"]["spec"]
    assert spec["route"]["matchers"] == [{"name": "stack", "value": settings.stack, "matchType": "="}]
    routed = {r["matchers"][0]["value"]: r["receiver"] for r in spec["route"]["routes"]}
    assert routed == {"page": "frontier-page", "warn": "frontier-warn", "info": "frontier-info"}
    receivers = {r["name"]: r for r in spec["receivers"]}
    page = receivers["frontier-page"]
    assert [c["to"] for c in page["emailConfigs"]] == ["oncall@frontier.example"]
    assert [c["url"] for c in page["webhookConfigs"]] == ["https://pager.frontier.example/in"]
    assert [c["to"] for c in receivers["frontier-warn"]["emailConfigs"]] == ["team@frontier.example"]
    configs = [
        c for r in spec["receivers"] for kind in ("emailConfigs", "webhookConfigs") for c in r.get(kind, [])
    ]
    assert all(c["sendResolved"] for c in configs)  # a resolved alert clears the page


def test_an_sqs_route_is_refused_on_kubernetes_naming_the_field(eks_prod):
    queue = "arn:aws:sqs:us-east-1:123456789012:pager"
    settings = with_alerts(eks_prod, {"routes": {"warn": {"sqs_queue_arns": [queue]}}})
    with pytest.raises(FrontierError, match=r"alerts\.routes\.warn\.sqs_queue_arns .*cannot deliver to SQS"):
        monitoring.alertmanager_config(settings)


def test_the_dashboard_config_map_carries_grafanas_label_and_every_panel(eks_prod):
    config_map = objects(eks_prod)["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    [(name, text)] = config_map["data"].items()
    assert name.endswith(".json")
    dashboard = json.loads(text)
    assert [p["title"] for p in dashboard["panels"]] == [p.title for p in panels()]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert any("DCGM_FI_DEV_GPU_UTIL" in e for e in exprs) and any(
        "node_memory_MemAvailable_bytes" in e for e in exprs
    )


def test_the_dashboards_runtime_and_container_series_are_the_stacks_namespaces_only(eks_prod):
    """Another stack's runtimes in the same Prometheus carry the same job and container name."""
    config_map = objects(eks_prod)["ConfigMap"]
    dashboard = json.loads(next(iter(config_map["data"].values())))
    namespace = eks_prod.kubernetes.namespace
    selectors: list[promql_parser.VectorSelector] = []

    def keep(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            selectors.append(node)

    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            promql_parser.walk(promql_parser.parse(target["expr"]), keep)
    labels = [{m.name: m.value for m in s.matchers.matchers} for s in selectors]
    stack_series = [found for found in labels if "job" in found or "container" in found]
    assert len(stack_series) >= 6, labels
    assert all(found.get("namespace") == namespace for found in stack_series), stack_series


def test_fab_render_writes_the_monitoring_objects_beside_the_workload(eks_prod):
    files = m.manifest_files(eks_prod, DIGEST)
    written = {
        name: yaml.safe_load(text)
        for name, text in files.items()
        if name.startswith("kubernetes/monitoring/")
    }
    assert sorted(d["kind"] for d in written.values()) == sorted(
        o.kind for o in monitoring.monitoring_objects(eks_prod)
    )


def test_the_dcgm_exporter_is_hardened_as_far_as_dcgm_allows(eks_prod):
    """Everything checkov asks of a workload, but root with SYS_ADMIN: the profiling counters need it."""
    daemon = objects(eks_prod)["DaemonSet"]
    spec = daemon["spec"]["template"]["spec"]
    [container] = spec["containers"]
    context = container["securityContext"]
    assert container["image"].startswith("nvcr.io/nvidia/k8s/dcgm-exporter@sha256:")
    assert container["imagePullPolicy"] == "IfNotPresent"  # content-addressed: nothing to pull again
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    # The API server refuses allowPrivilegeEscalation false beside the spelling CAP_SYS_ADMIN only.
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}
    assert container["livenessProbe"]["httpGet"]["port"] == monitoring.DCGM_PORT
    writable = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    assert writable == {m["name"] for m in container["volumeMounts"] if not m.get("readOnly")}


def test_checkov_exceptions_sit_on_the_dcgm_exporter_only_each_with_its_reason(eks_prod):
    daemon = objects(eks_prod)["DaemonSet"]
    skips = {k: v for k, v in daemon["metadata"]["annotations"].items() if k.startswith("checkov.io/skip")}
    assert {
        v.split("=", 1)[0]: v.split("=", 1)[1] for v in skips.values()
    } == monitoring.DCGM_CHECKOV_EXCEPTIONS
    assert all(v.count("=") == 1 for v in skips.values())  # checkov splits on "="
    for settings in (eks_prod, load_stack("eks-multinode")):
        for rel, text in m.manifest_files(settings, DIGEST).items():
            # The log shipper's DaemonSet carries its own (tests/kubernetes/test_pod_log_manifests.py).
            if ("dcgm-exporter" not in rel or "daemonset" not in rel) and not rel.startswith(
                "kubernetes/logging/"
            ):
                assert "checkov.io/" not in text, rel


def test_a_checkov_exception_without_a_reason_is_refused():
    with pytest.raises(ValueError, match="CKV_K8S_39"):
        monitoring.checkov_skips({"CKV_K8S_39": "a=b"})
