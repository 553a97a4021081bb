"""Rules that span several fields of a stack (each problem names the field, value and allowed range)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from frontier.capacity.memory import memory_fit
from frontier.config.hardware import INSTANCE_STORE, instance_store
from frontier.config.schema import Kubernetes, ModelPool, NodeGroup, Settings
from frontier.contracts import DIGEST_PATTERN


@dataclass(frozen=True)
class Problem:
    path: str
    value: object
    message: str


def cross_check(s: Settings) -> Iterator[Problem]:
    """Rules that span fields: parallelism vs topology, batching vs queueing, memory fit."""
    rt, model = s.runtime, s.model
    tp, pp, ep = rt.tensor_parallel_size, rt.pipeline_parallel_size, rt.expert_parallel_size

    if rt.batch.max_batch_size > rt.max_concurrency:
        yield Problem(
            "runtime.batch.max_batch_size",
            rt.batch.max_batch_size,
            f"must be <= runtime.max_concurrency ({rt.max_concurrency})",
        )
    if rt.max_concurrency > rt.queue.max_length:
        yield Problem(
            "runtime.max_concurrency",
            rt.max_concurrency,
            f"must be <= runtime.queue.max_length ({rt.queue.max_length}): the queue must hold one full wave",
        )
    if rt.batch.max_num_batched_tokens < rt.batch.max_batch_size:
        yield Problem(
            "runtime.batch.max_num_batched_tokens",
            rt.batch.max_num_batched_tokens,
            f"must be >= runtime.batch.max_batch_size ({rt.batch.max_batch_size}): one decode token per sequence",
        )
    if not rt.batch.chunked_prefill and rt.batch.max_num_batched_tokens < model.max_seq_len:
        yield Problem(
            "runtime.batch.max_num_batched_tokens",
            rt.batch.max_num_batched_tokens,
            f"must be >= model.max_seq_len ({model.max_seq_len}) when chunked_prefill is off",
        )
    if model.hidden_size % model.num_attention_heads:
        yield Problem(
            "model.hidden_size",
            model.hidden_size,
            f"must be divisible by model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_attention_heads % model.num_kv_heads:
        yield Problem(
            "model.num_kv_heads",
            model.num_kv_heads,
            f"must divide model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_attention_heads % tp:
        yield Problem(
            "runtime.tensor_parallel_size",
            tp,
            f"must divide model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        yield Problem(
            "runtime.tensor_parallel_size",
            tp,
            f"must divide model.num_kv_heads ({model.num_kv_heads}) or be a multiple of it (KV heads are "
            "split across tensor-parallel ranks, or replicated when there are fewer heads than ranks)",
        )
    if model.num_layers % pp:
        yield Problem(
            "runtime.pipeline_parallel_size", pp, f"must divide model.num_layers ({model.num_layers})"
        )
    if ep > 1 and model.num_experts == 0:
        yield Problem(
            "runtime.expert_parallel_size", ep, "must be 1 for a dense model (model.num_experts = 0)"
        )
    if model.num_experts and model.num_experts % ep:
        yield Problem(
            "runtime.expert_parallel_size", ep, f"must divide model.num_experts ({model.num_experts})"
        )

    names = [group.name for group in s.node_groups]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield Problem(f"node_groups[{i}].name", name, "must be unique among node_groups")

    for i, group in enumerate(s.node_groups):
        where = f"node_groups[{i}]"
        yield from _fleet_problems(s, where, group)
        if group.min_size <= group.max_size and not group.min_size <= group.desired_size <= group.max_size:
            yield Problem(
                f"{where}.desired_size",
                group.desired_size,
                f"must lie within min_size ({group.min_size}) .. max_size ({group.max_size})",
            )
        if not _runs_first_pool(s, group):
            continue  # another pool's node group: checked with that pool's runtime below
        if tp * pp > group.gpus_per_node:
            yield Problem(
                "runtime.tensor_parallel_size",
                tp,
                f"tensor ({tp}) x pipeline ({pp}) parallel = {tp * pp} GPUs must fit the "
                f"{group.gpus_per_node} GPUs per node of node group {group.name!r}",
            )
        if ep > group.nvlink_domain_gpus:
            yield Problem(
                "runtime.expert_parallel_size",
                ep,
                f"an expert-parallel group must stay inside one NVLink domain: node group {group.name!r} "
                f"has nvlink_domain_gpus = {group.nvlink_domain_gpus}",
            )
        fit = memory_fit(s, group)
        if not fit.fits:
            yield Problem(
                f"{where}.gpu_memory_gb",
                group.gpu_memory_gb,
                "the model does not fit: " + fit.explain(),
            )

    desired = s.serving_group.desired_size
    if desired > 1:
        # A rollout takes the canary hosts, then batch_size hosts, out of service at once; either way
        # at least one host must keep serving.
        for field in ("canary_hosts", "batch_size"):
            value = getattr(s.rollout, field)
            if value >= desired:
                yield Problem(
                    f"rollout.{field}",
                    value,
                    f"must be < node_groups[0].desired_size ({desired}) so that a host keeps serving",
                )
    if s.rollout.deregistration_delay_s > s.runtime.drain_timeout_s + 600:
        yield Problem(
            "rollout.deregistration_delay_s",
            s.rollout.deregistration_delay_s,
            f"is far beyond runtime.drain_timeout_s ({s.runtime.drain_timeout_s}); keep them close",
        )
    if s.health.timeout_s >= s.health.interval_s and s.health.interval_s > 1:
        yield Problem(
            "health.timeout_s", s.health.timeout_s, f"must be < health.interval_s ({s.health.interval_s})"
        )
    if s.health.readiness_path == s.health.liveness_path:
        yield Problem(
            "health.readiness_path",
            s.health.readiness_path,
            "must differ from health.liveness_path: readiness drains, liveness restarts",
        )
    if s.inventory.source == "static" and not s.inventory.hosts:
        yield Problem("inventory.hosts", [], "a static inventory needs at least one host")
    seen_names: set[str] = set()
    seen_slots: set[tuple[str, int, str]] = set()
    for i, host in enumerate(s.inventory.hosts):
        if host.name in seen_names:
            yield Problem(f"inventory.hosts[{i}].name", host.name, "must be unique among inventory.hosts")
        slot = (host.address, host.ssh_port, host.root)
        if slot in seen_slots:
            yield Problem(
                f"inventory.hosts[{i}].root",
                host.root,
                f"another host already uses {host.address}:{host.ssh_port} with this root",
            )
        seen_names.add(host.name)
        seen_slots.add(slot)
    if s.local is not None:
        ports = {
            "runtime.port": s.runtime.port,
            "local.moto_port": s.local.moto_port,
            "local.balancer_port": s.local.balancer_port,
            "local.balancer_stats_port": s.local.balancer_stats_port,
        }
        taken: dict[int, str] = {}
        for field, port in ports.items():
            if port in taken:
                yield Problem(field, port, f"must differ from {taken[port]} (both listen on this machine)")
            taken.setdefault(port, field)
    yield from _target_problems(s)
    yield from pool_problems(s)
    yield from tenant_problems(s)
    if s.kubernetes is not None:
        yield from kubernetes_problems(s, s.kubernetes)
    # The edge terminates TLS with an ACM certificate, except behind a cluster's own ingress class.
    own_tls = s.kubernetes is not None and s.kubernetes.ingress.kind == "class"
    if s.target != "local" and not own_tls and not s.edge.certificate_arn.startswith("arn:aws:acm:"):
        yield Problem(
            "edge.certificate_arn", s.edge.certificate_arn, "must be an ACM certificate ARN (HTTPS only)"
        )
    if s.slo.p99_latency_ms < s.slo.ttft_ms:
        yield Problem("slo.p99_latency_ms", s.slo.p99_latency_ms, f"must be >= slo.ttft_ms ({s.slo.ttft_ms})")


# --- targets and the Kubernetes block --------------------------------------------------------------

# RFC 1123 label: what Kubernetes accepts as a namespace name.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
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


def _fleet_problems(s: Settings, where: str, group: NodeGroup) -> Iterator[Problem]:
    """Sizes, the pinned AMI and the model cache of one node group the EC2 fleet builds."""
    if group.min_size > group.max_size:
        yield Problem(
            f"{where}.min_size",
            group.min_size,
            f"must be <= max_size ({group.max_size}); the group scales between them",
        )
    slots = len(s.inventory.hosts)
    if s.local is not None and s.inventory.source == "static" and not s.models and group.max_size > slots:
        # The local stand-in for an auto scaling group grows only into the slots the stack lists.
        yield Problem(
            f"{where}.max_size",
            group.max_size,
            f"must be <= the {slots} host slot(s) of inventory.hosts: a local group launches only listed slots",
        )
    if s.target != "ec2":
        return
    if not group.ami_id:
        yield Problem(
            f"{where}.ami_id",
            group.ami_id,
            "an EC2 stack pins its AMI (ami- followed by 8 or 17 hex digits); "
            f"`fab ami.latest -s {s.stack}` proposes the newest one",
        )
    if group.model_cache == "instance_store" and instance_store(group.instance_type)[0] == 0:
        known = ", ".join(sorted(INSTANCE_STORE))
        yield Problem(
            f"{where}.model_cache",
            group.model_cache,
            f"{group.instance_type} has no NVMe instance store; use 'ebs', or one of: {known}",
        )


def _target_problems(s: Settings) -> Iterator[Problem]:
    if s.target == "local" and s.local is None:
        yield Problem("target", s.target, "needs a 'local:' section (the embedded stack)")
    if s.local is not None and s.target != "local":
        yield Problem("target", s.target, "must be 'local' (or absent) in a stack with a 'local:' section")
    if s.target == "kubernetes" and s.kubernetes is None:
        yield Problem("kubernetes", None, "target 'kubernetes' needs a 'frontier:kubernetes' section")
    if s.kubernetes is not None and s.target != "kubernetes":
        yield Problem(
            "target", s.target, "must be 'kubernetes' in a stack with a 'frontier:kubernetes' section"
        )


def kubernetes_problems(s: Settings, k: Kubernetes) -> Iterator[Problem]:
    """A Kubernetes block that the API server or the scheduler would refuse, refused at load."""
    if len(k.namespace) > DNS_LABEL_MAX or not DNS_LABEL.match(k.namespace):
        yield Problem(
            "kubernetes.namespace",
            k.namespace,
            f"must be a DNS label (RFC 1123): 1 to {DNS_LABEL_MAX} lowercase letters, digits or '-', "
            "starting and ending with a letter or digit",
        )
    cluster = k.cluster
    if cluster.mode == "existing" and not (cluster.kubeconfig and cluster.context):
        yield Problem(
            "kubernetes.cluster.kubeconfig",
            cluster.kubeconfig,
            "an existing cluster needs both kubeconfig (a file path) and context",
        )
    if cluster.mode == "create" and (cluster.kubeconfig or cluster.context):
        yield Problem(
            "kubernetes.cluster.kubeconfig",
            cluster.kubeconfig or cluster.context,
            "must be empty when the stack creates its cluster (Pulumi makes the kubeconfig)",
        )
    if cluster.mode == "existing" and not k.runtime_role_arn.startswith("arn:aws:iam::"):
        yield Problem(
            "kubernetes.runtime_role_arn",
            k.runtime_role_arn,
            "an existing cluster needs the IAM role (arn:aws:iam::<account>:role/<name>) its runtime assumes",
        )
    if cluster.mode == "existing" and not cluster.api_server_cidrs:
        yield Problem(
            "kubernetes.cluster.api_server_cidrs",
            [],
            "an existing cluster needs the CIDRs its API server reaches pods from (the gate reads /metrics that way)",
        )
    if cluster.mode == "existing" and k.ingress.kind == "alb" and not k.ingress.source_cidrs:
        yield Problem(
            "kubernetes.ingress.source_cidrs",
            [],
            "an ALB in an existing cluster's VPC needs the CIDRs of the subnets it lives in",
        )
    if len(s.pools) > 1:
        yield Problem(
            "models",
            [pool.name for pool in s.pools],
            "a kubernetes stack serves one model (one Deployment behind its Ingress); the gateway that "
            "routes between model pools runs on the ec2 and local targets only: one stack per model",
        )
    if s.gateway is not None:
        yield Problem(
            "gateway",
            None,
            "the gateway runs on the ec2 and local targets only; a kubernetes stack's Ingress reaches its "
            "runtime directly",
        )
    groups = {group.name: group for group in s.node_groups}
    gpus = s.runtime.tensor_parallel_size * s.runtime.pipeline_parallel_size
    names: list[str] = []
    for i, pool in enumerate(k.node_pools):
        where = f"kubernetes.node_pools[{i}]"
        if pool.name in names:
            yield Problem(f"{where}.name", pool.name, "must be unique among kubernetes.node_pools")
        names.append(pool.name)
        group = groups.get(pool.node_group)
        if group is None:
            yield Problem(
                f"{where}.node_group", pool.node_group, f"must name one of node_groups ({', '.join(groups)})"
            )
            continue
        for j, instance_type in enumerate(pool.instance_types or (group.instance_type,)):
            known = GPUS_PER_INSTANCE.get(instance_type)
            if instance_type != group.instance_type and known is None:
                yield Problem(
                    f"{where}.instance_types[{j}]",
                    instance_type,
                    f"GPU count unknown; use node group {group.name!r}'s {group.instance_type} or one of "
                    + ", ".join(sorted(GPUS_PER_INSTANCE)),
                )
                continue
            per_node = group.gpus_per_node if known is None else known
            if gpus > per_node:
                yield Problem(
                    f"{where}.instance_types[{j}]" if pool.instance_types else "runtime.tensor_parallel_size",
                    instance_type if pool.instance_types else s.runtime.tensor_parallel_size,
                    f"a runtime pod requests {gpus} nvidia.com/gpu (tensor x pipeline parallel) but a "
                    f"{instance_type} node of pool {pool.name!r} has {per_node}; allowed: at most {per_node}",
                )
            elif known is not None and known != group.gpus_per_node:
                yield Problem(
                    f"{where}.instance_types[{j}]",
                    instance_type,
                    f"has {known} GPUs; node group {group.name!r} plans for {group.gpus_per_node} per node",
                )
    if s.serving_group.name not in {pool.node_group for pool in k.node_pools}:
        yield Problem(
            "kubernetes.node_pools",
            [pool.node_group for pool in k.node_pools],
            f"one pool must run the serving node group {s.serving_group.name!r} (node_groups[0])",
        )
    auto = k.autoscaling
    if auto.min_replicas > auto.max_replicas:
        yield Problem(
            "kubernetes.autoscaling.min_replicas",
            auto.min_replicas,
            f"must be <= kubernetes.autoscaling.max_replicas ({auto.max_replicas})",
        )
    if auto.max_replicas > s.serving_group.max_size:
        yield Problem(
            "kubernetes.autoscaling.max_replicas",
            auto.max_replicas,
            f"one replica per node: must be <= node_groups[0].max_size ({s.serving_group.max_size})",
        )
    spare = s.rollout.max_surge + s.rollout.canary_hosts
    if auto.max_replicas + spare > s.serving_group.max_size:
        yield Problem(
            "kubernetes.autoscaling.max_replicas",
            auto.max_replicas,
            f"one replica per node: at full scale a rollout also places rollout.max_surge + rollout.canary_hosts "
            f"= {spare} pod(s), so at most node_groups[0].max_size - {spare} = {s.serving_group.max_size - spare}",
        )
    if auto.min_replicas <= s.rollout.batch_size:
        yield Problem(
            "kubernetes.autoscaling.min_replicas",
            auto.min_replicas,
            f"must be > rollout.batch_size ({s.rollout.batch_size}): the disruption budget keeps a replica serving",
        )
    if k.ingress.kind == "class" and not k.ingress.tls_secret:
        yield Problem("kubernetes.ingress.tls_secret", "", "an ingress class needs the TLS Secret's name")
    if k.image:
        repository, _, digest = k.image.partition("@")
        if not DIGEST_PATTERN.match(digest):
            yield Problem(
                "kubernetes.image",
                k.image,
                "is a mutable reference: name the image by digest, <repository>@sha256:<64 hex> "
                "(tags such as ':latest' move under a running Deployment)",
            )
        elif repository != s.runtime.image_repository:
            yield Problem(
                "kubernetes.image",
                k.image,
                f"must be from runtime.image_repository ({s.runtime.image_repository})",
            )


# --- model pools, the gateway and tenants ----------------------------------------------------------


def _runs_first_pool(s: Settings, group: object) -> bool:
    # A one-model stack may run its model on any node group; a stack that lists models runs each
    # pool on its own group only.
    return not s.models or group == s.pool_group(s.pools[0])


# Problems a pool's own model and runtime can have, as cross_check words them for the first pool.
_POOL_FIELDS = ("model.", "runtime.", "node_groups[0].gpu_memory_gb")


def pool_problems(s: Settings) -> Iterator[Problem]:
    """Each listed model: a unique name, a known node group and hosts, its own fit and rules."""
    if not s.models:
        return
    groups = [group.name for group in s.node_groups]
    hosts = [host.name for host in s.inventory.hosts]
    seen: dict[str, int] = {}
    host_owner: dict[str, str] = {}
    for i, pool in enumerate(s.pools):
        where = f"models[{i}]"
        if pool.name in seen:
            yield Problem(
                f"{where}.model.name", pool.name, f"must be unique among models (models[{seen[pool.name]}])"
            )
        seen.setdefault(pool.name, i)
        if pool.node_group and pool.node_group not in groups:
            yield Problem(
                f"{where}.node_group", pool.node_group, f"must name one of node_groups ({', '.join(groups)})"
            )
        for j, host in enumerate(pool.hosts):
            if host not in hosts:
                yield Problem(
                    f"{where}.hosts[{j}]", host, f"must name one of inventory.hosts ({', '.join(hosts)})"
                )
            elif host in host_owner:
                yield Problem(
                    f"{where}.hosts[{j}]", host, f"already runs model {host_owner[host]!r}: one pool per host"
                )
            host_owner.setdefault(host, pool.name)
        if len(s.pools) > 1 and s.inventory.source == "static" and not pool.hosts:
            yield Problem(
                f"{where}.hosts",
                [],
                "with several models, each pool must list the inventory.hosts it runs on",
            )
        if i:
            yield from _pool_rules(s, i, pool)
    if len(s.pools) > 1 and s.local is None:
        # Outside the local stack the gateway finds a pool's hosts by their node group's tag.
        seen_groups: dict[str, str] = {}
        for i, pool in enumerate(s.pools):
            group = s.pool_group(pool).name
            if group in seen_groups:
                yield Problem(
                    f"models[{i}].node_group",
                    pool.node_group or group,
                    f"already runs model {seen_groups[group]!r}: each pool needs its own node group",
                )
            seen_groups.setdefault(group, pool.name)
    if len(s.pools) > 1 and s.gateway is None:
        yield Problem(
            "gateway", None, f"{len(s.pools)} models need a 'frontier:gateway' section to route by model"
        )


def _pool_rules(s: Settings, i: int, pool: ModelPool) -> Iterator[Problem]:
    """cross_check's model, runtime and memory rules for pool ``i``, named by its place in models."""
    group = s.pool_group(pool)
    alone = s.for_pool(pool.name).model_copy(
        update={"node_groups": (group,), "models": (), "tenants": (), "gateway": None}
    )
    for problem in cross_check(alone):
        if problem.path.startswith(_POOL_FIELDS):
            path = problem.path.replace("node_groups[0]", f"node_groups[{s.node_groups.index(group)}]")
            if not path.startswith("node_groups"):
                path = f"models[{i}].{path}"
            yield Problem(path, problem.value, problem.message)


def tenant_problems(s: Settings) -> Iterator[Problem]:
    """Tenants name served models, unique names and secrets; a gateway has tenants and vice versa."""
    if s.gateway is not None and not s.tenants:
        yield Problem(
            "tenants",
            [],
            "a stack with a gateway needs at least one tenant (name, api_key_secret, models, quotas, priority)",
        )
    if s.tenants and s.gateway is None:
        yield Problem(
            "gateway", None, "tenants need a 'frontier:gateway' section (the gateway enforces their quotas)"
        )
    served = [pool.name for pool in s.pools]
    names: dict[str, int] = {}
    secrets: dict[str, int] = {}
    for i, tenant in enumerate(s.tenants):
        where = f"tenants[{i}]"
        if tenant.name in names:
            yield Problem(
                f"{where}.name", tenant.name, f"must be unique among tenants (tenants[{names[tenant.name]}])"
            )
        names.setdefault(tenant.name, i)
        if tenant.api_key_secret in secrets:
            yield Problem(
                f"{where}.api_key_secret",
                tenant.api_key_secret,
                f"must differ from tenants[{secrets[tenant.api_key_secret]}]'s: a key identifies one tenant",
            )
        secrets.setdefault(tenant.api_key_secret, i)
        for j, model in enumerate(tenant.models):
            if model not in served:
                yield Problem(
                    f"{where}.models[{j}]",
                    model,
                    f"must name a model this stack serves ({', '.join(served)})",
                )
    gw = s.gateway
    if gw is not None:
        if not gw.min_size <= gw.desired_size <= gw.max_size:
            yield Problem(
                "gateway.desired_size",
                gw.desired_size,
                f"must lie within min_size ({gw.min_size}) .. max_size ({gw.max_size})",
            )
        if s.local is not None:
            taken = {s.runtime.port, s.local.moto_port, s.local.balancer_port, s.local.balancer_stats_port}
            if gw.port in taken:
                yield Problem(
                    "gateway.port",
                    gw.port,
                    f"must differ from the runtime, moto and balancer ports ({sorted(taken)})",
                )
        elif not gw.ami_id:
            yield Problem("gateway.ami_id", "", "the gateway's node group needs a pinned AMI (ami-...)")
        if s.local is None and gw.metering_uri and not gw.metering_uri.startswith("s3://"):
            yield Problem(
                "gateway.metering_uri", gw.metering_uri, "must be s3://bucket/prefix outside the local stack"
            )
