"""A replica over several nodes on Kubernetes: the LeaderWorkerSet and what goes with it.

The shipped ``eks-multinode`` stack serves a 405B-class model as tensor parallel 8 x pipeline
parallel 2 = 16 GPUs per replica over ``runtime.nodes_per_replica`` = 2 p5.48xlarge nodes. Its
objects are validated like every other stack's (``test_manifests.validate``: kubernetes-validate
strict for core kinds, the LWS v0.10.0 CRD's own schema for the LeaderWorkerSet); both pod
templates are validated as Pods too. No API server runs here.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from types import SimpleNamespace
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from frontier_hostside import names
from kube_stack_edit import set_field
from test_manifests import DIGEST, validate

from frontier import project
from frontier.config.schema import Settings
from frontier.render.host import render_runtime_config
from frontier.targets import load_stack
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.objects import TEMPLATE_HASH_ANNOTATION, selector
from policy.rules import kubernetes as policy_rules

STACK = "eks-multinode"


@pytest.fixture(scope="module")
def multinode() -> Settings:
    return load_stack(STACK)


@pytest.fixture(scope="module")
def workload(multinode: Settings) -> m.Workload:
    return m.render_workload(multinode, DIGEST)


@pytest.fixture(scope="module")
def objects(workload: m.Workload) -> m.PoolObjects:
    """The stack's one pool's objects."""
    (pool,) = workload.pools
    return pool


@pytest.fixture(scope="module")
def group(workload: m.Workload) -> dict[str, Any]:
    return workload.deployment.to_dict()


def _template(group: dict[str, Any], which: str) -> dict[str, Any]:
    return group["spec"]["leaderWorkerTemplate"][which]


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.slow
def test_every_object_of_the_multinode_stack_validates_strictly(multinode, workload):
    version = multinode.kubernetes.cluster.version
    for manifest in workload.all():
        validate(manifest.to_dict(), version)


def test_each_pod_template_validates_strictly_as_a_pod(multinode, group):
    for which in ("leaderTemplate", "workerTemplate"):
        pod = {"apiVersion": "v1", "kind": "Pod", **_template(group, which)}
        pod["metadata"] = {**pod["metadata"], "name": "group-0", "namespace": multinode.kubernetes.namespace}
        kubernetes_validate.validate(pod, multinode.kubernetes.cluster.version, strict=True)


@pytest.mark.slow
def test_the_lws_schema_refuses_what_the_crd_refuses(group):
    """Controls: an unknown field and a restart policy outside the CRD's enum both fail."""
    unknown = json.loads(json.dumps(group))
    unknown["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validate(unknown, "1.33")
    policy = json.loads(json.dumps(group))
    policy["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate(policy, "1.33")


def test_a_pool_spanning_nodes_runs_as_a_leader_worker_set_not_a_deployment(workload):
    kinds = [o.kind for o in workload.all()]
    assert "Deployment" not in kinds
    assert kinds.count("LeaderWorkerSet") == 1
    assert workload.runtime_deployments == []
    assert workload.leader_worker_sets == [workload.deployment]


def test_a_group_is_one_replica_of_nodes_per_replica_pods(multinode, group):
    assert group["spec"]["leaderWorkerTemplate"]["size"] == multinode.runtime.nodes_per_replica == 2
    assert "replicas" not in group["spec"]  # KEDA's


def test_the_loss_of_any_pod_recreates_the_whole_group(group):
    assert group["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"


def test_workers_start_once_the_leader_pod_exists_not_once_it_is_ready(group):
    # The leader is ready only after every node joined: LeaderReady would never start the workers.
    assert group["spec"]["startupPolicy"] == "LeaderCreated"


def test_the_lws_is_not_named_like_the_pools_service(objects):
    # The LWS controller makes a headless Service named after the LWS.
    assert objects.deployment.name != objects.service.name
    assert objects.deployment.name == f"{objects.service.name}{lw.NAME_SUFFIX}"


def test_the_service_selects_leaders_only(multinode, objects):
    chosen = objects.service.to_dict()["spec"]["selector"]
    assert chosen == {**selector(multinode), "leaderworkerset.sigs.k8s.io/worker-index": "0"}


def test_the_leader_is_a_one_node_replicas_pod_plus_rank_0_the_key_and_the_replica_ports(multinode, group):
    pool = multinode.only_pool
    one_node = m.pod_template(multinode, pool, DIGEST, render_runtime_config(multinode, pool), track="stable")
    leader = _template(group, "leaderTemplate")
    expected, container = _container(one_node), _container(leader)
    assert container["command"] == expected["command"]
    assert container["command"][3] == "serve"
    for field in ("image", "resources", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        assert container[field] == expected[field], field
    for field in ("securityContext", "volumeMounts"):
        assert container[field] == expected[field], field
    assert container["env"][: len(expected["env"])] == expected["env"]
    assert _env(container)[names.NODE_RANK_ENV] == "0"
    ports = {p["containerPort"] for p in container["ports"]}
    assert ports == {multinode.runtime.port, names.REPLICA_STEP_PORT, names.REPLICA_STORE_PORT}
    assert leader["spec"]["volumes"] == one_node["spec"]["volumes"]


def test_the_worker_runs_node_with_its_rank_and_its_leaders_address_from_lws(group):
    container = _container(_template(group, "workerTemplate"))
    assert container["command"][:4] == ["python", "-m", "frontier_runtime", names.NODE_COMMAND]
    env = _env(container)
    # The LWS pod webhook puts LWS_WORKER_INDEX and LWS_LEADER_ADDRESS first in every container's env.
    assert env[names.NODE_RANK_ENV] == "$(LWS_WORKER_INDEX)"
    assert env[names.LEADER_ADDRESS_ENV] == "$(LWS_LEADER_ADDRESS)"


def test_the_worker_serves_no_http_and_has_no_probes(group):
    container = _container(_template(group, "workerTemplate"))
    for field in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        assert field not in container, field


def test_every_pod_reads_the_replica_key_from_the_pools_secret(multinode, group):
    ref = {"secretKeyRef": {"name": lw.replica_key_secret(multinode), "key": lw.REPLICA_KEY_FIELD}}
    for which in ("leaderTemplate", "workerTemplate"):
        assert _env(_container(_template(group, which)))[names.REPLICA_KEY_ENV] == ref, which


def test_no_rendered_file_holds_a_replica_key_or_its_secret(multinode):
    files = m.manifest_files(multinode, DIGEST)
    assert not any("-secret-" in name for name in files)
    for text in files.values():
        assert "kind: Secret" not in text
    group = next(text for name, text in files.items() if "leaderworkerset" in name)
    assert group.count(names.REPLICA_KEY_ENV) == 2 and group.count("secretKeyRef") == 2


def test_each_pod_requests_its_share_of_the_replicas_gpus(multinode, group):
    rt = multinode.runtime
    ranks = rt.pipeline_parallel_size * max(rt.tensor_parallel_size, rt.expert_parallel_size)
    assert (ranks, rt.nodes_per_replica) == (16, 2)
    for which in ("leaderTemplate", "workerTemplate"):
        resources = _container(_template(group, which))["resources"]
        assert resources["limits"][names.GPU_RESOURCE] == str(ranks // rt.nodes_per_replica) == "8"
        assert resources["requests"] == resources["limits"]


def test_each_pod_asks_for_its_nodes_share_of_cpu_and_memory(multinode, group):
    # p5.48xlarge: 192 vCPUs, 2048 GiB; the pod holds all 8 GPUs, so the whole pod share of the node.
    resources = _container(_template(group, "workerTemplate"))["resources"]["requests"]
    assert resources["cpu"] == f"{math.floor(192 * 1000 * m.POD_SHARE_OF_NODE)}m"
    assert resources["memory"] == f"{math.floor(2048 * 1024 * m.POD_SHARE_OF_NODE)}Mi"


def test_both_templates_carry_the_pools_node_selector_and_tolerations(multinode, group):
    pool = multinode.kubernetes.node_pools[0]
    for which in ("leaderTemplate", "workerTemplate"):
        spec = _template(group, which)["spec"]
        assert spec["nodeSelector"] == pool.labels
        assert spec["tolerations"] == [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule", "operator": "Equal", "value": "present"}
        ]


def test_each_pod_of_a_group_lands_on_a_node_of_its_own(multinode, group):
    for which in ("leaderTemplate", "workerTemplate"):
        (term,) = _template(group, which)["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term == {
            "labelSelector": {"matchLabels": selector(multinode)},
            "topologyKey": "kubernetes.io/hostname",
        }


def test_leader_and_worker_run_the_same_image_digest_config_and_weights_cache(group):
    leader, worker = _template(group, "leaderTemplate"), _template(group, "workerTemplate")
    assert _container(leader)["image"] == _container(worker)["image"]
    assert _container(worker)["image"].endswith(f"@{DIGEST}")
    assert leader["spec"]["volumes"] == worker["spec"]["volumes"]
    assert _container(leader)["volumeMounts"] == _container(worker)["volumeMounts"]


def test_each_template_hash_covers_the_template_as_shipped(group):
    """The shape hash is over the leader's and the worker's own template, not the one-node pod's."""
    for which in ("leaderTemplate", "workerTemplate"):
        template = json.loads(json.dumps(_template(group, which)))
        stamped = template["metadata"]["annotations"].pop(TEMPLATE_HASH_ANNOTATION)
        assert stamped == hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def test_the_rollout_surges_whole_groups_and_keeps_every_serving_group(multinode, group):
    strategy = group["spec"]["rolloutStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": multinode.rollout.max_surge, "maxUnavailable": 0},
    }


def test_a_node_group_without_room_for_a_whole_group_rolls_batch_size_groups_at_once(multinode):
    # desired 9 of max 10: one node free, but a surging group needs two. LWS refuses 0 and 0.
    full = multinode.model_copy(
        update={"node_groups": [multinode.node_groups[0].model_copy(update={"desired_size": 9})]}
    )
    assert lw.rollout_strategy(full, full.only_pool)["rollingUpdateConfiguration"] == {
        "maxSurge": 0,
        "maxUnavailable": multinode.rollout.batch_size,
    }


def test_the_pools_pods_admit_all_tcp_from_each_other(multinode, workload):
    policy = next(p for p in workload.network_policies if p.name.endswith("-replica")).to_dict()
    pool = [{"podSelector": {"matchLabels": selector(multinode)}}]
    assert policy["spec"]["podSelector"] == {"matchLabels": selector(multinode)}
    assert policy["spec"]["ingress"] == [{"from": pool, "ports": [{"protocol": "TCP"}]}]
    assert policy["spec"]["egress"] == [{"to": pool, "ports": [{"protocol": "TCP"}]}]


def test_nothing_else_is_admitted_anew(multinode, eks_prod, workload):
    """The other policies are a one-node pool's: same sources and ports in, same peers out."""
    one_node = {p.name: p.to_dict()["spec"] for p in m.render_workload(eks_prod, DIGEST).network_policies}
    here = {p.name: p.to_dict()["spec"] for p in workload.network_policies if not p.name.endswith("-replica")}
    assert len(here) == len(one_node) == 3
    for name, spec in here.items():
        twin = one_node[name.replace(m.app_name(multinode), m.app_name(eks_prod))]
        for rules in ("ingress", "egress"):
            ports = [r.get("ports") for r in spec.get(rules, [])]
            assert ports == [r.get("ports") for r in twin.get(rules, [])], (name, rules)


def test_keda_scales_the_leader_worker_set_through_its_scale_subresource(objects):
    target = objects.scaled_object.to_dict()["spec"]["scaleTargetRef"]
    assert target == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": objects.deployment.name,
    }


def test_a_schedule_windows_node_floor_becomes_replicas_of_nodes_per_replica_nodes(multinode, objects):
    window = multinode.serving_group.schedule.windows[0]
    cron = next(t for t in objects.scaled_object.to_dict()["spec"]["triggers"] if t["type"] == "cron")
    assert (window.min_size, cron["metadata"]["desiredReplicas"]) == (8, "4")


def test_the_disruption_budget_counts_every_pod_of_the_pool(multinode, objects):
    budget = objects.disruption_budget.to_dict()["spec"]
    leader_labels = _template(objects.deployment.to_dict(), "leaderTemplate")["metadata"]["labels"]
    worker_labels = _template(objects.deployment.to_dict(), "workerTemplate")["metadata"]["labels"]
    for labels in (leader_labels, worker_labels):
        assert budget["selector"]["matchLabels"].items() <= labels.items()


def test_a_single_node_pool_still_gets_its_deployment(eks_prod):
    workload = m.render_workload(eks_prod, DIGEST)
    assert [o.kind for o in workload.all()].count("Deployment") == 1
    assert "LeaderWorkerSet" not in {o.kind for o in workload.all()}
    (objects,) = workload.pools
    assert objects.service.to_dict()["spec"]["selector"] == selector(eks_prod)
    assert objects.scaled_object.to_dict()["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert not any(p.name.endswith("-replica") for p in workload.network_policies)
    env = {e["name"] for e in _container(workload.deployment.to_dict()["spec"]["template"])["env"]}
    assert not env & {names.NODE_RANK_ENV, names.REPLICA_KEY_ENV, names.LEADER_ADDRESS_ENV}


POD_CHECKS = (
    policy_rules.check_k8s_digest_images,
    policy_rules.check_k8s_not_privileged,
    policy_rules.check_k8s_gpu_requests_equal_limits,
    policy_rules.check_k8s_containers_hardened,
    policy_rules.check_k8s_containers_limited,
)


def test_each_pod_of_a_group_passes_the_policy_packs_pod_rules(group):
    """The policy pack reads a LeaderWorkerSet's two pod templates, the leader's and the workers'."""
    lws = SimpleNamespace(resource_type=policy_rules.K8S_LEADER_WORKER_SET[0])
    assert len(policy_rules.pod_specs(lws.resource_type, group)) == 2
    for check in POD_CHECKS:
        assert list(check(group, lws)) == [], check.__name__


def test_the_policy_pack_sees_a_privileged_worker_template(group):
    lws = SimpleNamespace(resource_type=policy_rules.K8S_LEADER_WORKER_SET[0])
    broken = copy.deepcopy(group)
    _container(_template(broken, "workerTemplate"))["securityContext"]["privileged"] = True
    assert any("is privileged" in p for p in policy_rules.check_k8s_not_privileged(broken, lws))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """eks-gateway with its small model's replica over two one-GPU nodes (pipeline parallel 2), the
    big one still on one node; four replicas at most, so two-node replicas fit the l40s group (the
    small model colocated: a disaggregated replica runs on one rank)."""
    path = tmp_path_factory.mktemp("mixed") / "Pulumi.eks-gateway.yaml"
    document = yaml.safe_load((project.stacks_dir() / path.name).read_text())
    for field, value in {
        "models[1].disaggregation": None,
        "models[1].runtime.pipeline_parallel_size": 2,
        "models[1].runtime.nodes_per_replica": 2,
        "kubernetes.autoscaling.max_replicas": 4,
    }.items():
        set_field(document["config"], field, value)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack("eks-gateway", path=path)


@pytest.mark.slow
def test_behind_the_gateway_only_the_pool_spanning_nodes_becomes_a_leader_worker_set(mixed):
    workload = m.render_workload(mixed, DIGEST)
    big, small = (mixed.for_pool(pool.name) for pool in mixed.pools)
    assert [p.deployment.kind for p in workload.pools] == ["Deployment", "LeaderWorkerSet"]
    assert [p.service.to_dict()["spec"]["selector"] for p in workload.pools] == [
        selector(big),
        lw.leader_selector(small),
    ]
    replica = [p.name for p in workload.network_policies if p.name.endswith("-replica")]
    assert replica == [f"{m.app_name(small)}-replica"]
    for manifest in workload.all():
        validate(manifest.to_dict(), mixed.kubernetes.cluster.version)


@pytest.mark.parametrize("minor", range(25, 38))
def test_every_version_the_settings_allow_accepts_both_pod_templates(group, minor):
    """kubernetes.cluster.version allows 1.25-1.37: each accepts the leader's and the worker's pod."""
    for which in ("leaderTemplate", "workerTemplate"):
        pod = {"apiVersion": "v1", "kind": "Pod", **_template(group, which)}
        pod["metadata"] = {**pod["metadata"], "name": "group-0", "namespace": "frontier"}
        kubernetes_validate.validate(pod, f"1.{minor}", strict=True)
