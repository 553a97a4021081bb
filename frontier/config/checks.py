"""Rules that span several fields of a stack (each problem names the field, value and allowed range)."""

from __future__ import annotations

from collections.abc import Iterator

from frontier_settings import FieldProblem, problems_of
from pydantic import ValidationError

from frontier.config.memory import memory_fit
from frontier.config.schema import ModelPool, NodeGroup, Settings, runtime_config


def cross_check(s: Settings) -> Iterator[FieldProblem]:
    """Rules that span fields: parallelism vs topology, batching vs queueing, memory fit."""
    rt, model = s.runtime, s.model
    tp, pp, ep = rt.tensor_parallel_size, rt.pipeline_parallel_size, rt.expert_parallel_size

    # A fleet's policy, not the runtime's (which may run with no queue at all): a host that
    # restarts must find room for every request it was running.
    if rt.max_concurrency > rt.queue.max_length:
        yield FieldProblem(
            "runtime.max_concurrency",
            rt.max_concurrency,
            f"must be <= runtime.queue.max_length ({rt.queue.max_length}): the queue must hold one full wave",
        )
    # The runtime's own rules that span its section and the model's (the ones inside the runtime
    # section ran when it was parsed).
    try:
        runtime_config(model, rt)
    except ValidationError as exc:
        for problem in problems_of(exc):
            yield FieldProblem(_in_stack(problem.path), problem.value, problem.naming(_in_stack))
    yield from _attention_backend_problems(s)
    yield from _quantization_problems(s)
    yield from _timeout_chain_problems(s)
    if model.num_attention_heads % tp:
        yield FieldProblem(
            "runtime.tensor_parallel_size",
            tp,
            f"must divide model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        yield FieldProblem(
            "runtime.tensor_parallel_size",
            tp,
            f"must divide model.num_kv_heads ({model.num_kv_heads}) or be a multiple of it (KV heads are "
            "split across tensor-parallel ranks, or replicated when there are fewer heads than ranks)",
        )
    if model.num_layers % pp:
        yield FieldProblem(
            "runtime.pipeline_parallel_size", pp, f"must divide model.num_layers ({model.num_layers})"
        )
    if ep > 1 and model.num_experts == 0:
        yield FieldProblem(
            "runtime.expert_parallel_size", ep, "must be 1 for a dense model (model.num_experts = 0)"
        )
    if model.num_experts and model.num_experts % ep:
        yield FieldProblem(
            "runtime.expert_parallel_size", ep, f"must divide model.num_experts ({model.num_experts})"
        )

    names = [group.name for group in s.node_groups]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield FieldProblem(f"node_groups[{i}].name", name, "must be unique among node_groups")

    for i, group in enumerate(s.node_groups):
        where = f"node_groups[{i}]"
        if group.min_size > group.max_size:
            yield FieldProblem(
                f"{where}.min_size",
                group.min_size,
                f"must be <= max_size ({group.max_size}); the group scales between them",
            )
        if group.min_size <= group.max_size and not group.min_size <= group.desired_size <= group.max_size:
            yield FieldProblem(
                f"{where}.desired_size",
                group.desired_size,
                f"must lie within min_size ({group.min_size}) .. max_size ({group.max_size})",
            )
        if not _runs_first_pool(s, group):
            continue  # another pool's node group: checked with that pool's runtime below
        if ep > group.nvlink_domain_gpus:
            yield FieldProblem(
                "runtime.expert_parallel_size",
                ep,
                f"an expert-parallel group must stay inside one NVLink domain: node group {group.name!r} "
                f"has nvlink_domain_gpus = {group.nvlink_domain_gpus}",
            )
        yield from _node_span_problems(s, group)
        fit = memory_fit(s, group)
        if not fit.fits:
            yield FieldProblem(
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
                yield FieldProblem(
                    f"rollout.{field}",
                    value,
                    f"must be < node_groups[0].desired_size ({desired}) so that a host keeps serving",
                )
    if s.rollout.deregistration_delay_s > s.runtime.drain_timeout_s + 600:
        yield FieldProblem(
            "rollout.deregistration_delay_s",
            s.rollout.deregistration_delay_s,
            f"is far beyond runtime.drain_timeout_s ({s.runtime.drain_timeout_s}); keep them close",
        )
    if s.health.timeout_s >= s.health.interval_s and s.health.interval_s > 1:
        yield FieldProblem(
            "health.timeout_s", s.health.timeout_s, f"must be < health.interval_s ({s.health.interval_s})"
        )
    if s.health.readiness_path == s.health.liveness_path:
        yield FieldProblem(
            "health.readiness_path",
            s.health.readiness_path,
            "must differ from health.liveness_path: readiness drains, liveness restarts",
        )
    if s.inventory.source == "static" and not s.inventory.hosts:
        yield FieldProblem("inventory.hosts", [], "a static inventory needs at least one host")
    seen_names: set[str] = set()
    seen_slots: set[tuple[str, int, str]] = set()
    for i, host in enumerate(s.inventory.hosts):
        if host.name in seen_names:
            yield FieldProblem(
                f"inventory.hosts[{i}].name", host.name, "must be unique among inventory.hosts"
            )
        slot = (host.address, host.ssh_port, host.root)
        if slot in seen_slots:
            yield FieldProblem(
                f"inventory.hosts[{i}].root",
                host.root,
                f"another host already uses {host.address}:{host.ssh_port} with this root",
            )
        seen_names.add(host.name)
        seen_slots.add(slot)
    yield from pool_problems(s)
    yield from tenant_problems(s)
    yield from scale_to_zero_problems(s)
    yield from alert_problems(s)
    if s.slo.p99_latency_ms < s.slo.ttft_ms:
        yield FieldProblem(
            "slo.p99_latency_ms", s.slo.p99_latency_ms, f"must be >= slo.ttft_ms ({s.slo.ttft_ms})"
        )


def _attention_backend_problems(s: Settings) -> Iterator[FieldProblem]:
    """A required attention backend the serving hosts cannot run is refused here, not at their start."""
    backend, group = s.runtime.attention_backend, s.serving_group
    on_cpu = group.accelerator == "cpu"
    if on_cpu and backend in ("flash-varlen", "triton"):
        yield FieldProblem(
            "runtime.attention_backend",
            backend,
            f"needs a GPU, and node group {group.name!r} serves on CPU; use 'auto', 'cpu-kernel' or 'sdpa-gather'",
        )
    if not on_cpu and backend == "cpu-kernel":
        yield FieldProblem(
            "runtime.attention_backend",
            backend,
            f"runs on CPU hosts only, and node group {group.name!r} serves on {group.accelerator}; "
            "use 'auto', 'triton', 'flash-varlen' or 'sdpa-gather'",
        )
    if backend == "flash-varlen" and s.runtime.kv_cache_dtype == "fp8":
        yield FieldProblem(
            "runtime.attention_backend",
            backend,
            "reads no fp8 KV cache (runtime.kv_cache_dtype is 'fp8'); use 'triton' or 'auto'",
        )


def _quantization_problems(s: Settings) -> Iterator[FieldProblem]:
    """fp8 weights need a GPU's float8 GEMMs: a CPU node group is refused here, before any host is
    touched, as the runtime would refuse it at start."""
    group = s.serving_group
    if s.model.quantization == "fp8" and group.accelerator == "cpu":
        yield FieldProblem(
            "model.quantization",
            "fp8",
            f"needs a CUDA GPU (float8_e4m3fn weights), and node group {group.name!r} serves on cpu, "
            "which runs model.quantization 'none' or 'int8'",
        )


def _timeout_chain_problems(s: Settings) -> Iterator[FieldProblem]:
    """The runtime's queue gives up (503 with retry-after) before whatever waits on it: the gateway's
    upstream request and the balancer's idle timeout (a non-streamed answer sends no byte until it is
    done). Where the balancer fronts the gateway is the target's rule (EC2's ``rules``)."""
    queue_s = s.runtime.queue.timeout_ms / 1000
    waiting = [("edge.idle_timeout_s", float(s.edge.idle_timeout_s))]
    if s.gateway is not None:
        waiting.append(("gateway.request_timeout_s", s.gateway.request_timeout_s))
    for name, seconds in waiting:
        if queue_s >= seconds:
            yield FieldProblem(
                "runtime.queue.timeout_ms",
                s.runtime.queue.timeout_ms,
                f"must give up before {name} ({seconds:g} s): a queued request would be cut off there "
                "without the runtime's 503 and retry-after",
            )


def scale_to_zero_problems(s: Settings) -> Iterator[FieldProblem]:
    """A node group may go to zero hosts only when the gateway holds its pools' requests while a
    replica starts (``gateway.hold.<model>``) and it says when to go (``idle_to_zero_s``); a hold
    gives up before the balancer cuts the silent connection, and before a launch is abandoned."""
    holds = s.gateway.hold if s.gateway is not None else {}
    for i, group in enumerate(s.node_groups):
        where = f"node_groups[{i}]"
        if group.min_size > 0:
            if group.idle_to_zero_s is not None:
                yield FieldProblem(
                    f"{where}.idle_to_zero_s",
                    group.idle_to_zero_s,
                    f"has no effect with min_size {group.min_size}: set min_size 0 to let the group go to zero",
                )
            continue
        served = [pool.name for pool in s.pools if s.pool_group(pool) == group]
        for name in served:
            if name not in holds:
                yield FieldProblem(
                    f"{where}.min_size",
                    0,
                    f"may be 0 only with a hold queue for model {name!r}: add gateway.hold.{name} "
                    "(max_requests 1..100000, timeout_s) so requests wait while a replica starts "
                    "instead of failing",
                )
        if served and group.idle_to_zero_s is None:
            yield FieldProblem(
                f"{where}.idle_to_zero_s",
                None,
                "must be set with min_size 0: seconds (1..86400) a pool idles before going to zero",
            )
    names = [pool.name for pool in s.pools]
    for name, hold in holds.items():
        where = f"gateway.hold.{name}"
        if name not in names:
            yield FieldProblem(where, name, f"must name a served model ({s.model_names()})")
        if hold.timeout_s >= s.edge.idle_timeout_s:
            yield FieldProblem(
                f"{where}.timeout_s",
                hold.timeout_s,
                f"must be < edge.idle_timeout_s ({s.edge.idle_timeout_s} s): nothing is sent while a request "
                "is held, so the balancer would cut it before the gateway's 503 and Retry-After",
            )
        if hold.timeout_s > s.rollout.readiness_timeout_s:
            yield FieldProblem(
                f"{where}.timeout_s",
                hold.timeout_s,
                f"must be <= rollout.readiness_timeout_s ({s.rollout.readiness_timeout_s:g} s): a replica not "
                "ready by then is abandoned, so holding longer waits for nothing",
            )


def is_production(s: Settings) -> bool:
    """``prod`` and ``<anything>-prod``: the stacks whose alarms must reach someone."""
    return s.stack == "prod" or s.stack.endswith("-prod")


def alert_problems(s: Settings) -> Iterator[FieldProblem]:
    """A production stack's page alarms reach someone: its page route names at least one address."""
    if is_production(s) and s.alert_route("page").empty:
        yield FieldProblem(
            "alerts.routes.page",
            None,
            f"stack {s.stack!r} is a production stack: its page alarms need at least one of emails, "
            "sqs_queue_arns or https_endpoints",
        )


def _node_span_problems(s: Settings, group: NodeGroup) -> Iterator[FieldProblem]:
    """A replica's ranks over its nodes: each node's share must fit the node, and a pipeline stage
    (a tensor- or expert-parallel group, all-reducing every layer) that spans nodes must stay in one
    NVLink domain (the runtime splits ranks over nodes in order: whole stages when N divides PP)."""
    rt = s.runtime
    nodes, ranks = rt.nodes_per_replica, rt.ranks
    if ranks % nodes:
        return  # the runtime section's own rule names it
    formula = (
        f"pipeline ({rt.pipeline_parallel_size}) x max(tensor ({rt.tensor_parallel_size}), "
        f"expert ({rt.expert_parallel_size})) parallel = {ranks} GPUs"
    )
    if rt.ranks_per_node > group.gpus_per_node:
        fix = (
            f"; set runtime.nodes_per_replica to {-(-ranks // group.gpus_per_node)} or more"
            if nodes == 1
            else ""
        )
        yield FieldProblem(
            "runtime.nodes_per_replica",
            nodes,
            f"{formula} over {nodes} node(s) is {rt.ranks_per_node} per node, more than the "
            f"{group.gpus_per_node} GPUs per node of node group {group.name!r}{fix}",
        )
    stage = max(rt.tensor_parallel_size, rt.expert_parallel_size)
    spanned = -(-stage // rt.ranks_per_node)  # nodes one stage's ranks lie on
    per_domain = max(1, group.nvlink_domain_gpus // group.gpus_per_node)  # nodes one NVLink domain joins
    if spanned > per_domain:
        yield FieldProblem(
            "runtime.nodes_per_replica",
            nodes,
            f"a pipeline stage's {stage} GPUs would lie on {spanned} nodes, but one NVLink domain joins "
            f"{per_domain} (nvlink_domain_gpus = {group.nvlink_domain_gpus}, {group.gpus_per_node} GPUs per node "
            f"in node group {group.name!r}): split the nodes between pipeline stages instead "
            "(nodes_per_replica dividing pipeline_parallel_size)",
        )


def _in_stack(path: str) -> str:
    """A field of the runtime's config where the stack file holds it: its model is the stack's."""
    return path if path.startswith("model.") else f"runtime.{path}"


def certificate_problems(s: Settings) -> Iterator[FieldProblem]:
    """An edge that AWS terminates TLS on needs an ACM certificate (HTTPS only): the rule of the
    targets whose load balancer is AWS's."""
    if not s.edge.certificate_arn.startswith("arn:aws:acm:"):
        yield FieldProblem(
            "edge.certificate_arn", s.edge.certificate_arn, "must be an ACM certificate ARN (HTTPS only)"
        )


# --- model pools, the gateway and tenants ----------------------------------------------------------


def _runs_first_pool(s: Settings, group: object) -> bool:
    # A one-model stack may run its model on any node group; a stack that lists models runs each
    # pool on its own group only.
    return not s.models or group == s.pool_group(s.pools[0])


# Problems a pool's own model and runtime can have, as cross_check words them for the first pool.
_POOL_FIELDS = ("model.", "runtime.", "node_groups[0].gpu_memory_gb")


def pool_problems(s: Settings) -> Iterator[FieldProblem]:
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
            yield FieldProblem(
                f"{where}.model.name", pool.name, f"must be unique among models (models[{seen[pool.name]}])"
            )
        seen.setdefault(pool.name, i)
        if pool.node_group and pool.node_group not in groups:
            yield FieldProblem(
                f"{where}.node_group", pool.node_group, f"must name one of node_groups ({', '.join(groups)})"
            )
        for j, host in enumerate(pool.hosts):
            if host not in hosts:
                yield FieldProblem(
                    f"{where}.hosts[{j}]", host, f"must name one of inventory.hosts ({', '.join(hosts)})"
                )
            elif host in host_owner:
                yield FieldProblem(
                    f"{where}.hosts[{j}]", host, f"already runs model {host_owner[host]!r}: one pool per host"
                )
            host_owner.setdefault(host, pool.name)
        if len(s.pools) > 1 and s.inventory.source == "static" and not pool.hosts:
            yield FieldProblem(
                f"{where}.hosts",
                [],
                "with several models, each pool must list the inventory.hosts it runs on",
            )
        if i:
            yield from _pool_rules(s, i, pool)
    if len(s.pools) > 1 and s.gateway is None:
        yield FieldProblem(
            "gateway", None, f"{len(s.pools)} models need a 'frontier:gateway' section to route by model"
        )


def _pool_rules(s: Settings, i: int, pool: ModelPool) -> Iterator[FieldProblem]:
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
            yield FieldProblem(path, problem.value, problem.text)


def tenant_problems(s: Settings) -> Iterator[FieldProblem]:
    """Tenants name served models, unique names and secrets; a gateway has tenants and vice versa."""
    if s.gateway is not None and not s.tenants:
        yield FieldProblem(
            "tenants",
            [],
            "a stack with a gateway needs at least one tenant (name, api_key_secret, models, quotas, priority)",
        )
    if s.tenants and s.gateway is None:
        yield FieldProblem(
            "gateway", None, "tenants need a 'frontier:gateway' section (the gateway enforces their quotas)"
        )
    served = [pool.name for pool in s.pools]
    names: dict[str, int] = {}
    secrets: dict[str, int] = {}
    for i, tenant in enumerate(s.tenants):
        where = f"tenants[{i}]"
        if tenant.name in names:
            yield FieldProblem(
                f"{where}.name", tenant.name, f"must be unique among tenants (tenants[{names[tenant.name]}])"
            )
        names.setdefault(tenant.name, i)
        if tenant.api_key_secret in secrets:
            yield FieldProblem(
                f"{where}.api_key_secret",
                tenant.api_key_secret,
                f"must differ from tenants[{secrets[tenant.api_key_secret]}]'s: a key identifies one tenant",
            )
        secrets.setdefault(tenant.api_key_secret, i)
        for j, model in enumerate(tenant.models):
            if model not in served:
                yield FieldProblem(
                    f"{where}.models[{j}]",
                    model,
                    f"must name a model this stack serves ({', '.join(served)})",
                )
    gw = s.gateway
    if gw is not None and not gw.min_size <= gw.desired_size <= gw.max_size:
        yield FieldProblem(
            "gateway.desired_size",
            gw.desired_size,
            f"must lie within min_size ({gw.min_size}) .. max_size ({gw.max_size})",
        )
