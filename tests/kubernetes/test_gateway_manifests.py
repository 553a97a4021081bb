"""A kubernetes stack with a gateway and two model pools (``stacks/Pulumi.eks-gateway.yaml``): its
objects validate strictly for the cluster's version, and say what the stack promises — a runtime
Deployment per pool on its node pool, the gateway in front of them, the Ingress at the gateway.

Validation as in ``test_manifests`` (kubernetes-validate, strict; CRD objects against the pinned
schemas); no API server runs here.
"""

from __future__ import annotations

import pytest
import yaml
from frontier_gateway.config import parse_config
from frontier_gateway.hold import POOL_LABEL, POOL_WAITING_METRIC
from frontier_hostside import names
from test_manifests import validate

from frontier.errors import StackError
from frontier.render.host import render_runtime_config
from frontier.targets import load_stack
from frontier.targets.kubernetes import gateway as gw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.network import ingress_source_cidrs

DIGEST = "sha256:" + "ab" * 32
BIG, SMALL = "llama-3.1-70b-instruct", "llama-3.1-8b-instruct"
# Object names are DNS labels: the model's name with every run of other characters as one '-'.
APP = {BIG: "frontier-llama-3-1-70b-instruct", SMALL: "frontier-llama-3-1-8b-instruct"}
# The 8B pool is disaggregated: a Deployment per half (test_disaggregation_manifests).
PREFILL, DECODE = f"{APP[SMALL]}-prefill", f"{APP[SMALL]}-decode"
RUNTIMES = (APP[BIG], PREFILL, DECODE)


@pytest.fixture(scope="module")
def workload(eks_gateway) -> m.Workload:
    return m.render_workload(eks_gateway, DIGEST)


def _by(objects: list, kind: str) -> dict[str, dict]:
    return {o.name: o.to_dict() for o in objects if o.kind == kind}


def test_every_object_of_the_gateway_stack_validates_strictly(eks_gateway, workload):
    version = eks_gateway.kubernetes.cluster.version
    for manifest in workload.all():
        validate(manifest.to_dict(), version)
    for pool in eks_gateway.pools:
        config = render_runtime_config(eks_gateway, pool)
        canary = m.deployment(eks_gateway, pool, DIGEST, config, track="canary", replicas=1)
        validate(canary.to_dict(), version)


def test_each_pool_has_its_own_deployment_service_config_and_scaler(workload):
    assert [pool.model for pool in workload.pools] == [BIG, SMALL, SMALL]
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "ScaledObject", "ServiceMonitor"):
        assert set(RUNTIMES) <= set(_by(workload.all(), kind)), kind
    configs = [pool.config_map.name for pool in workload.pools]
    assert [name.rsplit("-config-", 1)[0] for name in configs] == list(RUNTIMES)


def test_the_stacks_slo_alerts_are_rendered_once_not_per_pool(workload):
    rules = _by(workload.all(), "PrometheusRule")
    assert list(rules) == [f"{APP[BIG]}-alerts"]
    assert workload.pools[1].prometheus_rule is None


def test_each_pool_runs_on_the_node_pool_of_its_node_group(eks_gateway, workload):
    pools = {p.node_group: p for p in eks_gateway.kubernetes.node_pools}
    big, prefill, decode = (pool.deployment.to_dict()["spec"]["template"]["spec"] for pool in workload.pools)
    assert big["nodeSelector"] == pools["h100"].labels
    assert prefill["nodeSelector"] == pools["l40s-prefill"].labels
    assert decode["nodeSelector"] == pools["l40s"].labels
    for small in (prefill, decode):
        assert small["containers"][0]["resources"]["limits"][names.GPU_RESOURCE] == "1"
    assert big["containers"][0]["resources"]["limits"][names.GPU_RESOURCE] == "8"


def test_the_gateway_finds_a_pools_pods_by_its_services_endpoint_slices_and_accepts_its_config(
    eks_gateway, workload
):
    text = workload.gateway.config_map.to_dict()["data"][gw.GATEWAY_CONFIG_FILE]
    config = parse_config(text)  # the gateway's own parser: what it would refuse fails here
    namespace = eks_gateway.kubernetes.namespace
    pools = {pool.name: pool for pool in config.models}
    found = pools[BIG].discovery
    assert pools[BIG].replicas == () and found is not None
    assert (found.namespace, found.service, found.port) == (namespace, APP[BIG], 8000)
    assert APP[BIG] in _by(workload.all(), "Service")  # the Service whose slices it reads
    # A disaggregated pool's colocated fallback: its decode Service, whose replicas prefill themselves.
    assert pools[SMALL].replicas == (f"http://{DECODE}.{namespace}.svc.cluster.local:8000",)
    assert config.admin_host == "0.0.0.0"
    assert [t.api_key_secret for t in config.tenants] == [t.api_key_secret for t in eks_gateway.tenants]


def test_the_gateway_may_list_endpoint_slices_in_its_namespace_and_nothing_else(eks_gateway, workload):
    roles, bindings = _by(workload.all(), "Role"), _by(workload.all(), "RoleBinding")
    role = roles[f"{gw.GATEWAY_NAME}-discovery"]
    assert role["metadata"]["namespace"] == eks_gateway.kubernetes.namespace
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
    binding = bindings[f"{gw.GATEWAY_NAME}-discovery"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": gw.GATEWAY_SERVICE_ACCOUNT, "namespace": eks_gateway.kubernetes.namespace}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_only_the_gateways_container_gets_a_token_projected_where_clients_look_for_it(workload):
    pod = workload.gateway.deployment.to_dict()["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    [mount] = [v for v in pod["containers"][0]["volumeMounts"] if v["name"] == gw.API_ACCESS_VOLUME]
    assert mount == {"name": gw.API_ACCESS_VOLUME, "mountPath": gw.SERVICE_ACCOUNT_DIR, "readOnly": True}
    [volume] = [v for v in pod["volumes"] if v["name"] == gw.API_ACCESS_VOLUME]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
    for runtime in workload.runtime_deployments:  # the runtimes' pods ask the API nothing
        spec = runtime.to_dict()["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert not [v for v in spec.get("volumes", []) if "projected" in v]


def test_a_changed_gateway_config_is_a_new_configmap_and_a_new_pod_template(eks_gateway):
    before = m.render_workload(eks_gateway, DIGEST).gateway
    section = eks_gateway.gateway.model_copy(update={"retries": 0})
    after = m.render_workload(eks_gateway.model_copy(update={"gateway": section}), DIGEST).gateway
    assert before.config_map.name != after.config_map.name
    volumes = after.deployment.to_dict()["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["configMap"]["name"] == after.config_map.name
    strategy = after.deployment.to_dict()["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_gateway_is_probed_on_its_health_paths_and_runs_its_own_image(eks_gateway, workload):
    spec = workload.gateway.deployment.to_dict()["spec"]
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == eks_gateway.kubernetes.gateway_image
    assert container["command"][:2] == ["frontier-gateway", "serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == names.READINESS_PATH
    assert container["livenessProbe"]["httpGet"]["path"] == names.LIVENESS_PATH
    assert spec["replicas"] == eks_gateway.gateway.desired_size
    assert workload.gateway.disruption_budget.to_dict()["spec"]["maxUnavailable"] == 1


def test_the_ingress_reaches_the_gateway_service_only(eks_gateway, workload):
    ingress = workload.ingress.to_dict()
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": gw.GATEWAY_NAME, "port": {"name": "http"}}
    annotations = ingress["metadata"]["annotations"]
    assert annotations["alb.ingress.kubernetes.io/healthcheck-path"] == names.READINESS_PATH


def test_runtimes_take_traffic_from_the_gateway_not_the_load_balancer(eks_gateway, workload):
    policies = _by(workload.all(), "NetworkPolicy")
    alb = [{"ipBlock": {"cidr": cidr}} for cidr in ingress_source_cidrs(eks_gateway)]
    gateway_pods = {"podSelector": {"matchLabels": gw.gateway_selector()}}
    for runtime in RUNTIMES:
        sources = policies[f"{runtime}-ingress"]["spec"]["ingress"][0]["from"]
        assert gateway_pods in sources
        assert not [peer for peer in alb if peer in sources]
    public, admin = policies["frontier-gateway-ingress"]["spec"]["ingress"]
    assert public["from"] == alb and public["ports"] == [
        {"protocol": "TCP", "port": eks_gateway.gateway.port}
    ]
    assert admin["ports"] == [{"protocol": "TCP", "port": eks_gateway.gateway.admin_port}]
    assert all("namespaceSelector" in peer for peer in admin["from"])  # Prometheus only
    egress = policies["frontier-gateway-egress"]["spec"]["egress"]
    # Pods of this namespace: a peer with a podSelector and no namespaceSelector (DNS has both).
    to_pools = [rule for rule in egress if set(rule["to"][0]) == {"podSelector"}]
    assert [rule["to"][0]["podSelector"]["matchLabels"][names.K8S_INSTANCE_LABEL] for rule in to_pools] == [
        *RUNTIMES
    ]


def test_a_pool_that_scales_to_zero_starts_on_the_gateways_held_requests(eks_gateway, workload):
    big, *halves = (pool.scaled_object.to_dict()["spec"] for pool in workload.pools)
    for small in halves:
        assert small["idleReplicaCount"] == 0
        held = next(t for t in small["triggers"] if t["name"] == "held-by-gateway")
        query = held["metadata"]["query"]
        assert POOL_WAITING_METRIC in query and f'{POOL_LABEL}="{SMALL}"' in query
    assert big["minReplicaCount"] == eks_gateway.kubernetes.autoscaling.min_replicas
    assert "held-by-gateway" not in [t["name"] for t in big["triggers"]]
    # The metric KEDA reads is scraped from the gateway's admin port.
    monitor = workload.gateway.service_monitor.to_dict()["spec"]["endpoints"][0]
    assert monitor["port"] == "admin" and monitor["path"] == names.METRICS_PATH


def test_fab_render_writes_every_object_of_both_pools_and_the_gateway(eks_gateway):
    files = m.manifest_files(eks_gateway, DIGEST)
    kinds_names = {(d["kind"], d["metadata"]["name"]) for d in map(yaml.safe_load, files.values())}
    assert ("Deployment", gw.GATEWAY_NAME) in kinds_names
    assert {("Deployment", name) for name in RUNTIMES} <= kinds_names


# --- what the gateway stack refuses -----------------------------------------------------------------


def _refused(path, field: str) -> str:
    with pytest.raises(StackError) as err:
        load_stack("eks-gateway", path=path)
    lines = [line.strip() for line in str(err.value).splitlines() if line.strip().startswith(field + " ")]
    assert lines, f"no problem names {field!r} in:\n{err.value}"
    return lines[0]


def test_a_gateway_without_its_image_is_refused(gateway_stack):
    line = _refused(gateway_stack({"kubernetes.gateway_image": ""}), "kubernetes.gateway_image")
    assert "<repository>@sha256:<64 hex>" in line


def test_a_gateway_image_by_tag_is_refused(gateway_stack):
    line = _refused(gateway_stack({"kubernetes.gateway_image": "gw:latest"}), "kubernetes.gateway_image")
    assert "= 'gw:latest'" in line and "mutable" in line


def test_a_gateway_on_any_free_port_is_refused(gateway_stack):
    line = _refused(gateway_stack({"gateway.admin_port": 0}), "gateway.admin_port")
    assert "= 0" in line and "1-65535" in line


def test_metering_to_a_file_in_the_pod_is_refused(gateway_stack):
    line = _refused(
        gateway_stack({"gateway.metering": {"uri": "/var/metering.jsonl"}}), "gateway.metering.uri"
    )
    assert "'/var/metering.jsonl'" in line and "s3://" in line


def test_a_pool_whose_node_group_has_no_node_pool_is_refused(gateway_stack):
    path = gateway_stack({"kubernetes.node_pools": [{"name": "h100", "node_group": "h100"}]})
    line = _refused(path, "models[1].node_group")
    assert "= 'l40s'" in line and "no kubernetes.node_pools entry" in line


def test_an_existing_cluster_with_a_gateway_needs_the_gateways_role(gateway_stack):
    path = gateway_stack(
        {
            "kubernetes.cluster.mode": "existing",
            "kubernetes.cluster.kubeconfig": "~/.kube/config",
            "kubernetes.cluster.context": "prod",
            "kubernetes.cluster.deployer": "outside",
            "kubernetes.cluster.api_server_cidrs": ["10.60.240.0/28"],
            "kubernetes.runtime_role_arn": "arn:aws:iam::123456789012:role/frontier-runtime",
            "kubernetes.ingress.source_cidrs": ["10.51.128.0/18"],
        }
    )
    line = _refused(path, "kubernetes.gateway_role_arn")
    assert "IAM role" in line


def test_a_redis_quota_store_is_reached_from_the_gateway_on_its_port_inside_the_vpc(eks_gateway):
    quota = {"store": "redis", "redis_url": "rediss://quota.abc123.use1.cache.amazonaws.com:6380/0"}
    section = eks_gateway.gateway.model_copy(
        update={"quota": eks_gateway.gateway.quota.model_validate(quota)}
    )
    workload = m.render_workload(eks_gateway.model_copy(update={"gateway": section}), DIGEST)
    egress = _by(workload.all(), "NetworkPolicy")["frontier-gateway-egress"]["spec"]["egress"]
    assert {
        "to": [{"ipBlock": {"cidr": eks_gateway.network.vpc_cidr}}],
        "ports": [{"protocol": "TCP", "port": 6380}],
    } in egress


def test_behind_an_ingress_class_and_with_irsa_the_gateway_objects_validate_too(gateway_stack):
    path = gateway_stack(
        {
            "kubernetes.identity": "irsa",
            "kubernetes.ingress.kind": "class",
            "kubernetes.ingress.class_name": "nginx",
            "kubernetes.ingress.tls_secret": "frontier-tls",
        }
    )
    settings = load_stack("eks-gateway", path=path)
    workload = m.render_workload(settings, DIGEST, gateway_role_arn="arn:aws:iam::123456789012:role/gw")
    for manifest in workload.all():
        validate(manifest.to_dict(), settings.kubernetes.cluster.version)
    public = _by(workload.all(), "NetworkPolicy")["frontier-gateway-ingress"]["spec"]["ingress"][0]
    assert public["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": settings.kubernetes.ingress.controller_namespace
    }
    account = workload.gateway.service_account.to_dict()["metadata"]["annotations"]
    assert account == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/gw"}


def test_two_pools_whose_objects_would_share_a_name_are_refused(gateway_stack):
    # '.' and '-' both become '-' in an object name: the two Deployments would be one.
    line = _refused(gateway_stack({"models[1].model.name": "llama-3.1-70b.instruct"}), "models[1].model.name")
    assert "'frontier-llama-3-1-70b-instruct'" in line and "models[0]" in line


def test_a_pool_needing_more_gpus_than_its_nodes_have_is_refused(gateway_stack):
    # Colocated: a disaggregated pool's replicas run one rank each, whatever their nodes hold.
    path = gateway_stack({"models[1].disaggregation": None, "models[1].runtime.tensor_parallel_size": 2})
    line = _refused(path, "models[1].runtime.tensor_parallel_size")
    assert "= 2" in line and "has 1" in line
