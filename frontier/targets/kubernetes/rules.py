"""What the Kubernetes target refuses in a stack file: what the API server or the scheduler would.

Its ``kubernetes:`` section must be there and hold together (namespace, cluster, node pools,
autoscaling, ingress, image); every model pool runs on a node pool of its node group, and fits it;
a gateway has its image, fixed ports, durable metering and, on an existing cluster, its IAM role;
and the edge terminates TLS with an ACM certificate unless the cluster's own ingress class does.

A pool whose replica spans ``runtime.nodes_per_replica`` N nodes runs N pods per replica, one per
node, each with its share of the replica's GPUs (:mod:`frontier.targets.kubernetes.leader_workers`):
that share must fit a node, and replicas count N nodes each against the node group's max_size.

With ``rollout.traffic_steps`` each step must be a share the pool's replicas can carry
(:func:`traffic_step_problems`).

A disaggregated pool runs behind the gateway, each half on a node pool of its group, its floor of
replicas within the autoscaler's range (:func:`disaggregation_problems`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from frontier_hostside.names import DIGEST_PATTERN
from frontier_settings import FieldProblem

from frontier.config.checks import certificate_problems
from frontier.config.schema import (
    DTYPE_BYTES,
    GB,
    GP3_MAX_MIBPS,
    MIB,
    Kubernetes,
    Model,
    PoolSettings,
    Settings,
)
from frontier.targets.kubernetes import disaggregation as pd
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import shares
from frontier.targets.kubernetes.interruption import interruption_problems
from frontier.targets.kubernetes.manifests import gpus_per_pod, pod_gpus_formula, startup_failure_threshold
from frontier.targets.kubernetes.objects import app_name

# RFC 1123 label: what Kubernetes accepts as a namespace name.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
# The untainted CPU node group a created cluster runs its add-ons on (kubernetes.system_pool).
SYSTEM_POOL = "system"
# GPUs per instance of the EC2 types a node pool may name (a pod's GPUs must fit one node).
GPUS_PER_INSTANCE = {
    "g5.xlarge": 1,
    "g5.2xlarge": 1,
    "g5.12xlarge": 4,
    "g5.48xlarge": 8,
    "g6.xlarge": 1,
    "g6.12xlarge": 4,
    "g6.48xlarge": 8,
    "g6e.xlarge": 1,
    "g6e.12xlarge": 4,
    "g6e.48xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
}


def stack_problems(s: Settings) -> Iterator[FieldProblem]:
    """The ``kubernetes:`` section's problems, and the edge's certificate where AWS terminates TLS."""
    k = s.kubernetes
    if k is None:
        yield FieldProblem("kubernetes", None, "target 'kubernetes' needs a 'frontier:kubernetes' section")
        return
    yield from kubernetes_problems(s, k)
    yield from cluster_problems(s, k)
    # Spot nodes: all spot, and every pod on them terminated within the two-minute notice.
    yield from interruption_problems(s)
    if k.ingress.kind != "class":
        yield from certificate_problems(s)
    yield from traffic_step_problems(s)


def traffic_step_problems(s: Settings) -> Iterator[FieldProblem]:
    """``rollout.traffic_steps``: each pool's Service splits by replica ratio (:mod:`.shares`), so
    every step must be a distinct share of the pool's replicas; only a pool of one Deployment has a
    canary Deployment beside it to take the share; and a step raises pods before it lowers any."""
    steps = s.rollout.traffic_steps
    if not steps:
        return
    if s.rollout.max_surge + s.rollout.canary_hosts < 1:
        yield FieldProblem(
            "rollout.traffic_steps",
            list(steps),
            "a step raises the new release's pods before it lowers the old release's, so it needs room "
            "for one pod: rollout.max_surge + rollout.canary_hosts must be at least 1",
        )
    for i, pool in enumerate(s.pools):
        if pool.disaggregation is not None or lw.replica_spans_nodes(pool):
            kind = "two Deployments (prefill, decode)" if pool.disaggregation else "a LeaderWorkerSet"
            yield FieldProblem(
                "rollout.traffic_steps",
                list(steps),
                f"pools[{i}] ({pool.name!r}) runs as {kind}, with no canary Deployment beside it to "
                "carry a share of its traffic; leave it empty for this stack",
            )
            continue
        total = shares.rollout_replicas(pool)
        for problem in shares.unrealisable(steps, total):
            yield FieldProblem(
                "rollout.traffic_steps",
                list(steps),
                f"pools[{i}] ({pool.name!r}) runs {total} replicas (its replicas, else node group "
                f"{pool.group.name!r}'s desired_size) and its Service splits by replica: {problem.describe()}",
            )


def kubernetes_problems(s: Settings, k: Kubernetes) -> Iterator[FieldProblem]:
    """A Kubernetes block that the API server or the scheduler would refuse, refused at load."""
    if len(k.namespace) > DNS_LABEL_MAX or not DNS_LABEL.match(k.namespace):
        yield FieldProblem(
            "kubernetes.namespace",
            k.namespace,
            f"must be a DNS label (RFC 1123): 1 to {DNS_LABEL_MAX} lowercase letters, digits or '-', "
            "starting and ending with a letter or digit",
        )
    cluster = k.cluster
    if cluster.mode == "existing" and not (cluster.kubeconfig and cluster.context):
        yield FieldProblem(
            "kubernetes.cluster.kubeconfig",
            cluster.kubeconfig,
            "an existing cluster needs both kubeconfig (a file path) and context",
        )
    if cluster.mode == "create" and (cluster.kubeconfig or cluster.context):
        yield FieldProblem(
            "kubernetes.cluster.kubeconfig",
            cluster.kubeconfig or cluster.context,
            "must be empty when the stack creates its cluster (Pulumi makes the kubeconfig)",
        )
    if cluster.mode == "existing" and not k.runtime_role_arn.startswith("arn:aws:iam::"):
        yield FieldProblem(
            "kubernetes.runtime_role_arn",
            k.runtime_role_arn,
            "an existing cluster needs the IAM role (arn:aws:iam::<account>:role/<name>) its runtime assumes",
        )
    if cluster.mode == "existing" and not cluster.api_server_cidrs:
        yield FieldProblem(
            "kubernetes.cluster.api_server_cidrs",
            [],
            "an existing cluster needs the CIDRs its API server reaches pods from (the gate reads /metrics that way)",
        )
    if cluster.mode == "existing" and k.ingress.kind == "alb" and not k.ingress.source_cidrs:
        yield FieldProblem(
            "kubernetes.ingress.source_cidrs",
            [],
            "an ALB in an existing cluster's VPC needs the CIDRs of the subnets it lives in",
        )
    yield from gateway_problems(s, k)
    yield from pool_problems(s, k)
    yield from disaggregation_problems(s, k)
    groups = {group.name: group for group in s.node_groups}
    names: list[str] = []
    for i, pool in enumerate(k.node_pools):
        where = f"kubernetes.node_pools[{i}]"
        if pool.name in names:
            yield FieldProblem(f"{where}.name", pool.name, "must be unique among kubernetes.node_pools")
        names.append(pool.name)
        group = groups.get(pool.node_group)
        if group is None:
            yield FieldProblem(
                f"{where}.node_group", pool.node_group, f"must name one of node_groups ({', '.join(groups)})"
            )
            continue
        for j, instance_type in enumerate(pool.instance_types or (group.instance_type,)):
            known = GPUS_PER_INSTANCE.get(instance_type)
            if instance_type != group.instance_type and known is None:
                yield FieldProblem(
                    f"{where}.instance_types[{j}]",
                    instance_type,
                    f"GPU count unknown; use node group {group.name!r}'s {group.instance_type} or one of "
                    + ", ".join(sorted(GPUS_PER_INSTANCE)),
                )
                continue
            per_node = group.gpus_per_node if known is None else known
            # A type the node pool adds beside its group's own: every model pool on the group fits it.
            for served in s.pools_on(group):
                gpus = gpus_per_pod(served)
                if gpus > per_node and pool.instance_types:
                    yield FieldProblem(
                        f"{where}.instance_types[{j}]",
                        instance_type,
                        f"a runtime pod of model {served.name!r} requests {gpus} nvidia.com/gpu "
                        f"({pod_gpus_formula(served)}) but a {instance_type} node of pool {pool.name!r} has "
                        f"{per_node}; allowed: at most {per_node}",
                    )
            if known is not None and known != group.gpus_per_node:
                yield FieldProblem(
                    f"{where}.instance_types[{j}]",
                    instance_type,
                    f"has {known} GPUs; node group {group.name!r} plans for {group.gpus_per_node} per node",
                )
    auto = k.autoscaling
    yield from replica_group_problems(s, k)
    if auto.min_replicas > auto.max_replicas:
        yield FieldProblem(
            "kubernetes.autoscaling.min_replicas",
            auto.min_replicas,
            f"must be <= kubernetes.autoscaling.max_replicas ({auto.max_replicas})",
        )
    if auto.min_replicas <= s.rollout.batch_size:
        yield FieldProblem(
            "kubernetes.autoscaling.min_replicas",
            auto.min_replicas,
            f"must be > rollout.batch_size ({s.rollout.batch_size}): the disruption budget keeps a replica serving",
        )
    if k.ingress.kind == "class" and not k.ingress.tls_secret:
        yield FieldProblem(
            "kubernetes.ingress.tls_secret", "", "an ingress class needs the TLS Secret's name"
        )
    if k.image:
        repository, _, digest = k.image.partition("@")
        if not DIGEST_PATTERN.match(digest):
            yield FieldProblem(
                "kubernetes.image",
                k.image,
                "is a mutable reference: name the image by digest, <repository>@sha256:<64 hex> "
                "(tags such as ':latest' move under a running Deployment)",
            )
        else:
            for i, pool in enumerate(s.pools):
                if repository != pool.runtime.image_repository:
                    yield FieldProblem(
                        "kubernetes.image",
                        k.image,
                        f"must be from pools[{i}].runtime.image_repository ({pool.runtime.image_repository})",
                    )


def gateway_problems(s: Settings, k: Kubernetes) -> Iterator[FieldProblem]:
    """What a gateway Deployment could not run with."""
    gw = s.gateway
    if gw is None:
        return
    if not k.gateway_image:
        yield FieldProblem(
            "kubernetes.gateway_image",
            "",
            "a stack with a gateway runs it from its own image: <repository>@sha256:<64 hex> "
            "(frontier-gateway installed; the runtime image does not carry it)",
        )
    elif not DIGEST_PATTERN.match(k.gateway_image.partition("@")[2]):
        yield FieldProblem(
            "kubernetes.gateway_image",
            k.gateway_image,
            "is a mutable reference: name the image by digest, <repository>@sha256:<64 hex>",
        )
    for field, port in (("port", gw.port), ("admin_port", gw.admin_port)):
        if port == 0:
            yield FieldProblem(
                f"gateway.{field}",
                0,
                "must be a fixed port (1-65535) on kubernetes: the Service, probes and policies name it",
            )
    if not gw.metering.uri.startswith("s3://"):
        yield FieldProblem(
            "gateway.metering.uri",
            gw.metering.uri,
            "must be s3://bucket/prefix on kubernetes: a file in a pod is lost with the pod",
        )
    if k.cluster.mode == "existing" and not k.gateway_role_arn.startswith("arn:aws:iam::"):
        yield FieldProblem(
            "kubernetes.gateway_role_arn",
            k.gateway_role_arn,
            "an existing cluster with a gateway needs the IAM role (arn:aws:iam::<account>:role/<name>) "
            "its gateway assumes (tenants' key secrets, the runtimes' key, metering)",
        )


def pool_problems(s: Settings, k: Kubernetes) -> Iterator[FieldProblem]:
    """Each model pool: a node pool for its node group, a name of its own, pods and replicas that fit."""
    names: dict[str, int] = {}
    pooled = {pool.node_group for pool in k.node_pools}
    for i, pool in enumerate(s.pools):
        where = f"pools[{i}]"
        # A disaggregated pool's halves are named apart too (frontier-<model>-prefill, -decode).
        halves = pd.HALVES if pool.disaggregation is not None else ()
        for name in dict.fromkeys(app_name(pool, half) for half in (None, *halves)):
            if names.get(name, i) != i:
                yield FieldProblem(
                    f"{where}.model.name",
                    pool.name,
                    f"its Deployment would be named {name!r} like pools[{names[name]}]'s: "
                    "names must differ in letters or digits",
                )
            names.setdefault(name, i)
        group = pool.group
        if group.name not in pooled:
            yield FieldProblem(
                f"{where}.node_group",
                group.name,
                f"no kubernetes.node_pools entry runs node group {group.name!r}; add one "
                f"(node pools run: {', '.join(sorted(pooled))})",
            )
            continue
        gpus = gpus_per_pod(pool)
        if gpus > group.gpus_per_node:
            yield FieldProblem(
                f"{where}.{_split_field(pool)}",
                _split_value(pool),
                f"a runtime pod requests {gpus} nvidia.com/gpu ({pod_gpus_formula(pool)}) but a "
                f"{group.instance_type} node of node group {group.name!r} has {group.gpus_per_node}; "
                f"allowed: at most {group.gpus_per_node}",
            )
        if lw.replica_spans_nodes(pool):
            continue  # replica_group_problems sizes replicas in nodes
        where_group = f"node_groups[{s.node_groups.index(group)}]"
        if k.autoscaling.max_replicas > group.max_size:
            yield FieldProblem(
                "kubernetes.autoscaling.max_replicas",
                k.autoscaling.max_replicas,
                f"one replica per node of model {pool.name!r}: must be <= {where_group}.max_size ({group.max_size})",
            )
        spare = s.rollout.max_surge + s.rollout.canary_hosts
        if k.autoscaling.max_replicas + spare > group.max_size:
            yield FieldProblem(
                "kubernetes.autoscaling.max_replicas",
                k.autoscaling.max_replicas,
                f"one replica per node of model {pool.name!r}: at full scale a rollout also places "
                f"rollout.max_surge + rollout.canary_hosts = {spare} pod(s), so at most "
                f"{where_group}.max_size - {spare} = {group.max_size - spare}",
            )


def disaggregation_problems(s: Settings, k: Kubernetes) -> Iterator[FieldProblem]:
    """Each disaggregated pool: the gateway that sends its two hops, a node pool for its prefill
    group (its decode group is its own, checked above), and halves that fit their groups."""
    pooled = {pool.node_group for pool in k.node_pools}
    auto, spare = k.autoscaling, s.rollout.max_surge + s.rollout.canary_hosts
    for i, pool in enumerate(s.pools):
        if pool.disaggregation is None:
            continue
        where = f"pools[{i}].disaggregation"
        if s.gateway is None:
            yield FieldProblem(
                where,
                "prefill/decode",
                "runs behind the gateway on kubernetes (it sends each prompt to a prefill replica, then "
                "the request to a decode replica): add a 'frontier:gateway' section",
            )
        for half in pd.HALVES:
            role = getattr(pool.disaggregation, half)
            group = role.group
            if half == "prefill" and group.name not in pooled:
                yield FieldProblem(
                    f"{where}.prefill.node_group",
                    group.name,
                    f"no kubernetes.node_pools entry runs node group {group.name!r}; add one "
                    f"(node pools run: {', '.join(sorted(pooled))})",
                )
            if not s.rollout.batch_size < role.replicas <= auto.max_replicas:
                yield FieldProblem(
                    f"{where}.{half}.replicas",
                    role.replicas,
                    f"must be > rollout.batch_size ({s.rollout.batch_size}: the disruption budget keeps a "
                    f"replica serving) and <= kubernetes.autoscaling.max_replicas ({auto.max_replicas})",
                )
            if half == "prefill" and auto.max_replicas + spare > group.max_size:
                yield FieldProblem(
                    "kubernetes.autoscaling.max_replicas",
                    auto.max_replicas,
                    f"one prefill replica of model {pool.name!r} per node: at full scale a rollout also "
                    f"places {spare} pod(s), so at most node group {group.name!r}'s max_size - {spare} "
                    f"= {group.max_size - spare}",
                )


def _split_field(pool: PoolSettings) -> str:
    """The field that sizes a pod's GPUs: the tensor parallel size, or how many nodes share a replica."""
    return "runtime.nodes_per_replica" if lw.replica_spans_nodes(pool) else "runtime.tensor_parallel_size"


def _split_value(pool: PoolSettings) -> int:
    rt = pool.runtime
    return rt.nodes_per_replica if lw.replica_spans_nodes(pool) else rt.tensor_parallel_size


# The StatefulSet controller labels each pod with ``<statefulset>-<10-character hash>`` (at most 63
# characters), so a StatefulSet name may take 52. LWS names each group's workers' StatefulSet
# ``<leaderworkerset>-<group index>``.
STATEFULSET_NAME_MAX = 52


def replica_group_problems(s: Settings, k: Kubernetes) -> Iterator[FieldProblem]:
    """Each pool whose replica spans nodes: its replicas in nodes fit its node group, its groups'
    names fit what the StatefulSets under its LeaderWorkerSet may be named."""
    auto = k.autoscaling
    for i, pool in enumerate(s.pools):
        if not lw.replica_spans_nodes(pool):
            continue
        where = f"pools[{i}].runtime"
        nodes, group = pool.runtime.nodes_per_replica, pool.group
        ratio = s.rollout.gate.max_p99_ratio
        if ratio is not None:
            # The ratio compares a canary with the old release over the same window; a LeaderWorkerSet
            # replaces every group at once, so no old group serves beside a new one to compare with.
            yield FieldProblem(
                "rollout.gate.max_p99_ratio",
                ratio,
                f"cannot apply on kubernetes to a pool whose replica spans {where}.nodes_per_replica = "
                f"{nodes} nodes: its LeaderWorkerSet rolls with no canary beside "
                "the old release; leave it out (the absolute rollout.gate.max_p99_latency_ms still holds)",
            )
        # A rolling update surges whole groups; there is no canary group (group_rollout.py).
        surge = s.rollout.max_surge * nodes
        if auto.max_replicas * nodes + surge > group.max_size:
            yield FieldProblem(
                "kubernetes.autoscaling.max_replicas",
                auto.max_replicas,
                f"a replica of model {pool.name!r} spans {where}.nodes_per_replica = {nodes} nodes: "
                f"{auto.max_replicas} replicas x {nodes} nodes + rollout.max_surge {s.rollout.max_surge} "
                f"replica(s) x {nodes} nodes = {auto.max_replicas * nodes + surge} nodes, but node group "
                f"{group.name!r} has max_size {group.max_size}; allowed: at most "
                f"{max(0, (group.max_size - surge) // nodes)}",
            )
        longest = f"{lw.set_name(pool)}-{max(0, auto.max_replicas + s.rollout.max_surge - 1)}"
        if len(longest) > STATEFULSET_NAME_MAX:
            yield FieldProblem(
                f"pools[{i}].model.name",
                pool.name,
                f"its replicas' StatefulSets would be named like {longest!r} ({len(longest)} characters); "
                f"allowed: at most {STATEFULSET_NAME_MAX}: shorten the model's name",
            )


def startup_budget_s(s: Settings) -> int:
    """How long the startup probe lets a new pod take: failure threshold x period."""
    return startup_failure_threshold(s) * s.health.interval_s


def weights_read_s(model: Model, throughput_mibps: int) -> float:
    """Seconds to read ``model``'s weights once from a volume at ``throughput_mibps``."""
    return model.num_parameters * DTYPE_BYTES[model.dtype] / (throughput_mibps * MIB)


def cluster_problems(s: Settings, k: Kubernetes) -> Iterator[FieldProblem]:
    """What a cluster this stack creates could not do: load the model in time, or be reached."""
    if k.cluster.mode != "create":
        if "system_pool" in k.model_fields_set:
            yield FieldProblem(
                "kubernetes.system_pool",
                k.system_pool.instance_type,
                "only a cluster this stack creates gets a system node group; an existing cluster runs "
                "its add-ons on nodes of its own: remove the section",
            )
        return
    # The weights cache is an emptyDir on the node's gp3 root volume: a pod that cannot read its
    # model through it before the startup probe gives up is restarted, forever. Each model pool on
    # the node pools of its own node group.
    budget = startup_budget_s(s)
    # Each group a pool runs on: its own, or each of a disaggregated pool's halves'.
    for model, group in ((pool.model, group) for pool in s.pools for group in pool.groups):
        weights_gb = model.num_parameters * DTYPE_BYTES[model.dtype] / GB
        for i, pool in enumerate(k.node_pools):
            if pool.node_group != group.name:
                continue
            needed = weights_read_s(model, pool.root_volume_throughput_mibps)
            if needed > budget:
                yield FieldProblem(
                    f"kubernetes.node_pools[{i}].root_volume_throughput_mibps",
                    pool.root_volume_throughput_mibps,
                    f"reading model {model.name!r}'s {weights_gb:.0f} GB of weights at "
                    f"{pool.root_volume_throughput_mibps} MiB/s "
                    f"takes {needed:.0f} s, but the startup probe allows {budget} s (rollout.readiness_timeout_s "
                    f"= {s.rollout.readiness_timeout_s:g} in probes of health.interval_s = {s.health.interval_s}); "
                    f"raise it to at least {_mibps_for(model, budget)} MiB/s (gp3 allows {GP3_MAX_MIBPS}) or "
                    f"rollout.readiness_timeout_s to "
                    f"{needed:.0f} s",
                )
    if k.cluster.private_endpoint and k.cluster.deployer == "outside":
        yield FieldProblem(
            "kubernetes.cluster.deployer",
            k.cluster.deployer,
            "with kubernetes.cluster.private_endpoint the API answers only inside the VPC, and the same "
            "`pulumi up` applies the add-ons and the workloads through it: run it where network.vpc_cidr "
            "is reachable and set 'in-vpc', or set private_endpoint: false",
        )
    for i, gpu_pool in enumerate(k.node_pools):
        if gpu_pool.name == SYSTEM_POOL:
            yield FieldProblem(
                f"kubernetes.node_pools[{i}].name",
                gpu_pool.name,
                f"is the name of the cluster's system node group; name the pool anything but {SYSTEM_POOL!r}",
            )
    pool = k.system_pool
    if not pool.min_size <= pool.desired_size <= pool.max_size:
        yield FieldProblem(
            "kubernetes.system_pool.desired_size",
            pool.desired_size,
            f"must lie within min_size ({pool.min_size}) .. max_size ({pool.max_size})",
        )


def _mibps_for(model: Model, budget_s: int) -> int:
    return math.ceil(model.num_parameters * DTYPE_BYTES[model.dtype] / (budget_s * MIB))
