"""The rendered Kubernetes objects: valid for the cluster version each stack names, and what they promise.

Core objects are validated with kubernetes-validate (the Kubernetes OpenAPI schemas of that
version, strict: an unknown field fails); the CRD objects (KEDA's ScaledObject, the Prometheus
Operator's ServiceMonitor) against the pinned schemas in ``schemas/``. No API server runs here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from fabric.main import program
from frontier_hostside import names
from kube_stack_edit import set_field

from frontier import project
from frontier.capacity.gpus import INSTANCES
from frontier.config.load import available_stacks
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.render.host import render_runtime_config
from frontier.targets import load_stack
from frontier.targets.kubernetes import autoscaling, monitoring
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes import network_policies as netpol

DIGEST = "sha256:" + "ab" * 32
SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-2.16-scaledobject.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator-0.80-servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheus-operator-0.80-prometheusrule.json",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "lws-0.10-leaderworkerset.json",
}
EXISTING = {
    "kubernetes.cluster.mode": "existing",
    "kubernetes.cluster.kubeconfig": "~/.kube/config",
    "kubernetes.cluster.context": "prod",
    "kubernetes.cluster.version": "1.30",
    "kubernetes.cluster.api_server_cidrs": ["10.60.240.0/28"],
    "kubernetes.runtime_role_arn": "arn:aws:iam::123456789012:role/frontier-runtime",
    "kubernetes.identity": "irsa",
    "kubernetes.ingress.kind": "class",
    "kubernetes.ingress.class_name": "nginx",
    "kubernetes.ingress.tls_secret": "frontier-tls",
}


def kubernetes_stacks() -> list[Settings]:
    stacks = [load_stack(name) for name in available_stacks()]
    return [s for s in stacks if s.kubernetes is not None]


@pytest.fixture(scope="module")
def existing(tmp_path_factory) -> Settings:
    """eks-prod moved to an existing 1.30 cluster with its own ingress class and IRSA."""
    path = tmp_path_factory.mktemp("existing") / "Pulumi.eks-prod.yaml"
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.eks-prod.yaml").read_text())
    for field, value in EXISTING.items():
        set_field(document["config"], field, value)
    path.write_text(yaml.safe_dump(document))
    return load_stack("eks-prod", path=path)


def validate(manifest: dict, version: str) -> None:
    key = (manifest["apiVersion"], manifest["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
        jsonschema.validate(manifest, schema, cls=jsonschema.Draft202012Validator)
    else:
        kubernetes_validate.validate(manifest, version, strict=True)


def test_there_is_a_kubernetes_stack():
    assert [s.stack for s in kubernetes_stacks()] == ["eks-gateway", "eks-multinode", "eks-prod"]


@pytest.mark.parametrize("variant", ["shipped", "existing"])
@pytest.mark.slow
def test_every_manifest_of_every_kubernetes_stack_validates_for_its_version(variant, existing):
    stacks = kubernetes_stacks() if variant == "shipped" else [existing]
    for settings in stacks:
        objects = m.render_workload(settings, DIGEST).all()
        kinds = {o.kind for o in objects}
        # A replica over several nodes is a LeaderWorkerSet (test_multinode_manifests).
        runtime_kinds = {
            "LeaderWorkerSet" if pool.runtime.nodes_per_replica > 1 else "Deployment"
            for pool in settings.pools
        }
        assert kinds == {
            "Namespace",
            "Role",  # what fab may do in the namespace, and its binding (deploy_access.py)
            "RoleBinding",
            "ServiceAccount",
            "ConfigMap",
            "NetworkPolicy",
            *runtime_kinds,
            "Service",
            "PodDisruptionBudget",
            "Ingress",
            "ScaledObject",
            "ServiceMonitor",
            "PrometheusRule",
            "CronJob",  # the synthetic probe (probe.py)
        }
        for manifest in objects:
            validate(manifest.to_dict(), settings.kubernetes.cluster.version)
        for pool in settings.pools:
            view = settings.for_pool(pool.name)
            config = render_runtime_config(view, pool)
            canary = m.deployment(view, pool, DIGEST, config, track="canary", replicas=1)
            validate(canary.to_dict(), settings.kubernetes.cluster.version)


def test_the_validators_refuse_what_they_should(eks_prod):
    """Controls: strict validation fails an unknown field; the CRD schemas fail a wrong type."""
    deployment = m.render_workload(eks_prod, DIGEST).deployment.to_dict()
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.33", strict=True)
    scaled = autoscaling.scaled_object(eks_prod, eks_prod.only_pool).to_dict()
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 64  # KEDA takes strings only
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled, "1.33")
    monitor = monitoring.service_monitor(eks_prod, eks_prod.only_pool).to_dict()
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, "1.33")


def _pod(settings: Settings) -> dict:
    return m.render_workload(settings, DIGEST).deployment.to_dict()["spec"]["template"]


def test_the_deployment_runs_the_image_by_digest_and_refuses_a_tag(eks_prod):
    container = _pod(eks_prod)["spec"]["containers"][0]
    assert container["image"] == f"{eks_prod.runtime.image_repository}@{DIGEST}"
    with pytest.raises(FrontierError, match="mutable tags"):
        m.render_workload(eks_prod, "latest")


def test_gpu_requests_equal_limits_and_cover_tensor_times_pipeline_parallel(eks_prod):
    resources = _pod(eks_prod)["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["requests"][names.GPU_RESOURCE] == "8"


def _quantity(text: str) -> float:
    units = {"m": 1e-3, "Mi": 2**20, "Gi": 2**30, "": 1}
    number = text.rstrip("mMGi")
    return float(number) * units[text[len(number) :]]


def test_the_runtime_is_guaranteed_its_share_of_the_nodes_cpu_and_memory(eks_prod):
    # A pod without CPU and memory requests is BestEffort: the first evicted under node pressure, and
    # the scheduler places nothing by them. Requests equal to limits make it Guaranteed; sized to the
    # pod's share of the node's GPUs, below the node's capacity so the kubelet's reserve and the
    # DaemonSets still fit (a request above allocatable never schedules).
    resources = _pod(eks_prod)["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    node = INSTANCES["p5.48xlarge"]
    share = m.gpus_per_pod(eks_prod.only_pool) / node.gpus_per_node
    cpu, memory = _quantity(resources["requests"]["cpu"]), _quantity(resources["requests"]["memory"])
    assert 0.5 * share * node.vcpus <= cpu < share * node.vcpus
    assert 0.5 * share * node.memory_gib * 2**30 <= memory < share * node.memory_gib * 2**30


def test_probes_cover_the_load_time_then_readiness_and_liveness_on_the_configured_paths(eks_prod):
    container = _pod(eks_prod)["spec"]["containers"][0]
    health, rollout = eks_prod.health, eks_prod.rollout
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == health.readiness_path
    assert startup["periodSeconds"] * startup["failureThreshold"] >= rollout.readiness_timeout_s
    assert container["readinessProbe"]["httpGet"]["path"] == health.readiness_path
    assert container["readinessProbe"]["successThreshold"] == health.healthy_threshold
    assert container["livenessProbe"]["httpGet"]["path"] == health.liveness_path
    assert container["livenessProbe"]["successThreshold"] == 1


def test_termination_outlasts_deregistration_and_drain(eks_prod):
    pod = _pod(eks_prod)
    sleep = int(pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep >= eks_prod.rollout.deregistration_delay_s
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + math.ceil(eks_prod.runtime.drain_timeout_s)


def test_the_pod_is_locked_down_with_memory_shm_and_a_weights_cache(eks_prod):
    spec = _pod(eks_prod)["spec"]
    container = spec["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"
    assert mounts["weights-cache"] == eks_prod.runtime.weights_cache_dir
    assert volumes["weights-cache"]["emptyDir"]["sizeLimit"] == f"{eks_prod.kubernetes.weights_cache_gb}Gi"


def _runtime_pod_templates(settings: Settings) -> list[tuple[str, dict]]:
    """Every pod template that runs the runtime image: each pool's Deployment, or its
    LeaderWorkerSet's leader and workers."""
    templates = []
    for pool in m.render_workload(settings, DIGEST).pools:
        spec = pool.deployment.to_dict()["spec"]
        if "template" in spec:
            templates.append((pool.deployment.name, spec["template"]))
        else:
            lws = spec["leaderWorkerTemplate"]
            templates += [(f"{pool.deployment.name} leader", lws["leaderTemplate"])]
            templates += [(f"{pool.deployment.name} worker", lws["workerTemplate"])]
    return templates


def _mount_under(mounts: list[dict], path: str) -> dict | None:
    """The mount that holds ``path`` (the deepest whose mountPath is it or a folder above it)."""
    holding = [
        x for x in mounts if path == x["mountPath"] or path.startswith(x["mountPath"].rstrip("/") + "/")
    ]
    return max(holding, key=lambda x: len(x["mountPath"]), default=None)


@pytest.mark.parametrize("stack", ["eks-gateway", "eks-multinode", "eks-prod"])
def test_every_jit_cache_is_a_writable_volume_under_a_read_only_root(stack):
    """Triton, inductor and CUDA compile at first use and write where their variables say: each of
    those folders is on a writable emptyDir in every runtime pod, whose root stays read-only."""
    settings = load_stack(stack)
    templates = _runtime_pod_templates(settings)
    assert templates
    for where, template in templates:
        spec = template["spec"]
        container = next(c for c in spec["containers"] if c["name"] == names.CONTAINER_NAME)
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
        env = {e["name"]: e.get("value") for e in container["env"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for variable, folder in names.JIT_CACHE_ENV:
            assert env[variable] == folder, (where, variable)
            mount = _mount_under(container["volumeMounts"], folder)
            assert mount is not None, f"{where}: nothing mounted at {folder} ({variable})"
            assert mount["mountPath"] == names.JIT_CACHE_DIR and not mount.get("readOnly", False), where
            volume = volumes[mount["name"]]
            assert set(volume) == {"name", "emptyDir"}, (where, volume)
            assert volume["emptyDir"] == {"sizeLimit": f"{names.JIT_CACHE_MIB}Mi"}, where


def test_the_jit_cache_lies_outside_every_other_mount(eks_prod):
    """Its own volume: not under /tmp (the unit mounts that noexec on EC2) nor the weights cache
    (which the weights' garbage collection owns)."""
    container = _pod(eks_prod)["spec"]["containers"][0]
    others = [x for x in container["volumeMounts"] if x["mountPath"] != names.JIT_CACHE_DIR]
    assert _mount_under(others, names.JIT_CACHE_DIR) is None


def test_one_replica_per_node_on_the_gpu_pool(eks_prod):
    spec = _pod(eks_prod)["spec"]
    term = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == m.selector(eks_prod)
    pool = eks_prod.kubernetes.node_pools[0]
    assert spec["nodeSelector"] == pool.labels
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule", "operator": "Equal", "value": "present"}
    ]


def test_rolling_update_surges_first_when_the_pool_can_grow(eks_prod):
    spec = m.render_workload(eks_prod, DIGEST).deployment.to_dict()["spec"]
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "replicas" not in spec  # KEDA owns the count
    full = eks_prod.model_copy(
        update={"node_groups": (eks_prod.serving_group.model_copy(update={"max_size": 6}),)}
    )
    assert m.strategy(full, full.only_pool)["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 1}


def test_a_config_change_changes_the_config_map_and_the_pod_template(eks_prod):
    changed = eks_prod.model_copy(
        update={"runtime": eks_prod.runtime.model_copy(update={"drain_timeout_s": 45})}
    )
    (a,), (b,) = m.render_workload(eks_prod, DIGEST).pools, m.render_workload(changed, DIGEST).pools
    assert a.config_map.name != b.config_map.name
    annotation = names.K8S_CONFIG_HASH_ANNOTATION
    pod_a, pod_b = (p.deployment.to_dict()["spec"]["template"] for p in (a, b))
    assert pod_a["metadata"]["annotations"][annotation] != pod_b["metadata"]["annotations"][annotation]
    assert pod_b["spec"]["volumes"][0]["configMap"]["name"] == b.config_map.name
    assert b.config_map.body["data"]["runtime.yaml"] == render_runtime_config(changed, changed.only_pool)
    assert b.config_map.body["immutable"] is True


def test_the_namespace_enforces_restricted_pod_security(eks_prod):
    labels = m.namespace(eks_prod).labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.33"


def test_the_disruption_budget_follows_the_rollout_batch(eks_prod):
    pdb = m.disruption_budget(eks_prod, eks_prod.only_pool).to_dict()["spec"]
    assert pdb["maxUnavailable"] == eks_prod.rollout.batch_size
    assert pdb["selector"]["matchLabels"] == m.selector(eks_prod, "stable")


def test_keda_scales_on_the_runtimes_queue_depth(eks_prod):
    spec = autoscaling.scaled_object(eks_prod, eks_prod.only_pool).to_dict()["spec"]
    auto = eks_prod.kubernetes.autoscaling
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (auto.min_replicas, auto.max_replicas)
    trigger = spec["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"].startswith(f"sum({names.WAITING_METRIC}{{")
    assert trigger["metadata"]["threshold"] == str(auto.target_queue_depth)
    assert spec["scaleTargetRef"]["name"] == m.app_name(eks_prod)


def _prefix_matches(prefix: str, path: str) -> bool:
    """Kubernetes' Prefix match: element by element of the path split on '/'."""
    want = [p for p in prefix.split("/") if p]
    return [p for p in path.split("/") if p][: len(want)] == want


def _ingress(settings: Settings) -> dict:
    """The Ingress of a stack without a gateway: in front of its runtime's Service."""
    return m.ingress(settings, m.service(settings, settings.only_pool)).to_dict()


def test_the_ingress_forwards_only_the_api_paths_as_the_ec2_listener_does(eks_prod, existing):
    # An Ingress path "/" of type Prefix matches every path: /metrics and /health/* would be public.
    for settings in (eks_prod, existing):
        [rule] = _ingress(settings)["spec"]["rules"]
        paths = rule["http"]["paths"]
        # The EC2 listener's one forwarding rule is f"{API_PATH_PREFIX}*".
        assert [(p["path"], p["pathType"]) for p in paths] == [("/v1", "Prefix")]
        assert names.API_PATH_PREFIX == "/v1/"
        for served in (names.COMPLETIONS_PATH, names.CHAT_COMPLETIONS_PATH, names.MODELS_PATH):
            assert _prefix_matches(paths[0]["path"], served)
        for private in (names.METRICS_PATH, names.READINESS_PATH, names.LIVENESS_PATH, "/"):
            assert not _prefix_matches(paths[0]["path"], private), private


def test_ingress_terminates_tls(eks_prod, existing):
    alb = _ingress(eks_prod)
    assert alb["spec"]["tls"] == [{"hosts": [eks_prod.kubernetes.ingress.host]}]
    annotations = alb["metadata"]["annotations"]
    assert annotations["alb.ingress.kubernetes.io/certificate-arn"] == eks_prod.edge.certificate_arn
    assert json.loads(annotations["alb.ingress.kubernetes.io/listen-ports"]) == [{"HTTPS": 443}]
    assert annotations["alb.ingress.kubernetes.io/healthcheck-path"] == eks_prod.health.readiness_path
    nginx = _ingress(existing)
    assert nginx["spec"]["tls"][0]["secretName"] == "frontier-tls"
    assert nginx["spec"]["ingressClassName"] == "nginx"


def _policies(settings: Settings) -> dict[str, dict]:
    return {p.name.rsplit("-", 1)[-1]: p.to_dict()["spec"] for p in netpol.network_policies(settings)}


def test_network_policies_deny_by_default_and_admit_only_ingress_prometheus_and_the_api_server(
    eks_prod, existing
):
    for settings in (eks_prod, existing):
        policies = _policies(settings)
        assert policies["deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
        (rule,) = policies["ingress"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": settings.runtime.port}]
        peers = rule["from"]
        namespaces = [
            p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for p in peers
            if "namespaceSelector" in p
        ]
        blocks = [p["ipBlock"]["cidr"] for p in peers if "ipBlock" in p]
        assert "monitoring" in namespaces
        if settings.kubernetes.ingress.kind == "alb":
            # The public quarter of the VPC (the ALB) and the control plane's own /28s: no pod.
            assert blocks == ["10.50.128.0/18", "10.50.255.224/28", "10.50.255.240/28"]
        else:
            assert namespaces == ["ingress-nginx", "monitoring"] and blocks == ["10.60.240.0/28"]


def test_egress_is_dns_and_https_only_and_never_the_metadata_address(eks_prod, existing):
    for settings in (eks_prod, existing):
        egress = _policies(settings)["egress"]["egress"]
        ports = sorted((p["protocol"], p["port"]) for rule in egress for p in rule["ports"])
        blocks = [peer["ipBlock"] for rule in egress for peer in rule["to"] if "ipBlock" in peer]
        for block in blocks:
            assert block["cidr"] != names.INSTANCE_METADATA_CIDR
            if block["cidr"] == "0.0.0.0/0":
                assert block["except"] == [names.INSTANCE_METADATA_CIDR]
        if settings.kubernetes.identity == "pod_identity":
            assert ports == [("TCP", 53), ("TCP", 80), ("TCP", 443), ("UDP", 53)]
            assert {"cidr": netpol.POD_IDENTITY_AGENT} in blocks
        else:
            assert ports == [("TCP", 53), ("TCP", 443), ("UDP", 53)]


def test_the_service_account_carries_the_irsa_role_only_with_irsa(eks_prod, existing):
    assert m.service_account(eks_prod, eks_prod.only_pool, "arn:aws:iam::1:role/x").annotations == {}
    assert m.service_account(existing, existing.only_pool).annotations == {
        m.IRSA_ROLE_ANNOTATION: "arn:aws:iam::123456789012:role/frontier-runtime"
    }


def test_the_service_monitor_scrapes_metrics_with_the_operators_labels(eks_prod):
    monitor = monitoring.service_monitor(eks_prod, eks_prod.only_pool).to_dict()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_fab_render_writes_the_manifests_as_yaml(capsys, tmp_path, monkeypatch, eks_prod):
    monkeypatch.chdir(project.root())
    try:
        program.run(["fab", "render", "-s", "eks-prod", "--out", str(tmp_path), "--digest", DIGEST])
    except SystemExit as exc:
        assert not exc.code
    out = capsys.readouterr().out
    expected = m.render_workload(eks_prod, DIGEST).all()
    written = sorted((tmp_path / "kubernetes").glob("*.yaml"))
    assert len(written) == len(expected)
    for path, manifest in zip(written, expected, strict=True):
        assert yaml.safe_load(path.read_text()) == manifest.to_dict()
        assert path.name in out
    assert (tmp_path / "release" / "runtime.yaml").exists()


def test_other_stacks_render_no_manifests():
    assert m.manifest_files(load_stack("prod"), DIGEST) == {}


@pytest.mark.parametrize("minor", range(25, 38))
def test_every_version_the_settings_allow_validates_the_manifests(eks_prod, minor):
    """kubernetes.cluster.version allows 1.25-1.37: each of them accepts every core object."""
    version = f"1.{minor}"
    k = eks_prod.kubernetes
    settings = eks_prod.model_copy(
        update={
            "kubernetes": k.model_copy(update={"cluster": k.cluster.model_copy(update={"version": version})})
        }
    )
    for manifest in m.render_workload(settings, DIGEST).all():
        validate(manifest.to_dict(), version)


def test_the_stacks_alert_rules_go_to_the_operator_and_match_the_scrapes_job(eks_prod):
    from frontier.render.alerts import render_alerts

    rule = monitoring.prometheus_rule(eks_prod, eks_prod.only_pool).to_dict()
    scoped = render_alerts(eks_prod, monitoring.stack_scope(eks_prod))
    assert rule["spec"]["groups"] == yaml.safe_load(scoped)["groups"]
    job = monitoring.service_monitor(eks_prod, eks_prod.only_pool).to_dict()["spec"]["jobLabel"]
    service_labels = m.service(eks_prod, eks_prod.only_pool).labels
    # Prometheus names the job after the Service's label jobLabel names: the rules' job. The probe's
    # and the restarts' rules read kube-state-metrics' series (of the probe's CronJob, of the pods'
    # runtime container) instead.
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    kube_state = ("probe-failing", "runtime-restarts")
    assert all(
        f'job="{service_labels[job]}"' in r["expr"] for r in rules if r["labels"]["alarm"] not in kube_state
    )
    [probe] = [r for r in rules if r["labels"]["alarm"] == "probe-failing"]
    workload = m.render_workload(eks_prod, DIGEST).all()
    [cron_job] = [o for o in workload if o.kind == "CronJob"]
    assert f'cronjob=~"{cron_job.name}(-.+)?"' in probe["expr"]
    [restarts] = [r for r in rules if r["labels"]["alarm"] == "runtime-restarts"]
    [deployment] = [
        o for o in workload if o.kind == "Deployment" and o.name == m.app_name(eks_prod.only_pool)
    ]
    runtime = deployment.to_dict()["spec"]["template"]["spec"]["containers"][0]["name"]
    namespace = eks_prod.kubernetes.namespace
    assert (
        f'kube_pod_container_status_restarts_total{{container="{runtime}",namespace="{namespace}"}}'
        in restarts["expr"]
    )
    broken = json.loads(json.dumps(rule))
    broken["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, "1.33")
