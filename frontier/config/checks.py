"""Rules that span several fields of a stack (each problem names the field, value and allowed range)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import TypeVar

from frontier_runtime.ops.table import (
    ATTENTION_BACKENDS,
    AUTO,
    CPU,
    CUDA,
    QUANTIZATIONS,
    attention_backends_on,
    quantizations_on,
)
from frontier_settings import FieldProblem, problems_of
from pydantic import ValidationError

from frontier.config.image_cuda import driver_problems
from frontier.config.memory import memory_fit
from frontier.config.production import production_problems
from frontier.config.schema import PoolSettings, Settings, runtime_config


def cross_check(s: Settings) -> Iterator[FieldProblem]:
    """Rules that span fields: parallelism vs topology, batching vs queueing, memory fit."""
    for i, pool in enumerate(s.pools):
        yield from (problem.under(f"pools[{i}]") for problem in _pool_rules(s, pool))
        yield from _pool_fit_problems(s, pool)
        if s.rollout.deregistration_delay_s > pool.runtime.drain_timeout_s + 600:
            yield FieldProblem(
                "rollout.deregistration_delay_s",
                s.rollout.deregistration_delay_s,
                f"is far beyond pools[{i}].runtime.drain_timeout_s ({pool.runtime.drain_timeout_s}); keep them close",
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
        desired = group.desired_size
        if desired > 1 and s.pools_on(group):
            # A rollout takes the canary hosts, then batch_size hosts, out of service at once; either
            # way at least one host of the group it rolls must keep serving.
            for field in ("canary_hosts", "batch_size"):
                value = getattr(s.rollout, field)
                if value >= desired:
                    yield FieldProblem(
                        f"rollout.{field}",
                        value,
                        f"must be < {where}.desired_size ({desired}) so that a host keeps serving",
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
    yield from production_problems(s)
    yield from driver_problems(s)
    if s.slo.p99_latency_ms < s.slo.ttft_ms:
        yield FieldProblem(
            "slo.p99_latency_ms", s.slo.p99_latency_ms, f"must be >= slo.ttft_ms ({s.slo.ttft_ms})"
        )


def _pool_rules(s: Settings, pool: PoolSettings) -> Iterator[FieldProblem]:
    """The rules of one pool's model and runtime, named relative to the pool (``runtime.port``)."""
    rt, model = pool.runtime, pool.model
    tp, pp, ep = rt.tensor_parallel_size, rt.pipeline_parallel_size, rt.expert_parallel_size

    # A fleet's policy, not the runtime's (which may run with no queue at all): a host that
    # restarts must find room for every request it was running.
    if rt.max_concurrency > rt.queue.max_length:
        yield FieldProblem(
            "runtime.max_concurrency",
            rt.max_concurrency,
            "must be <= {runtime.queue.max_length}"
            + f" ({rt.queue.max_length}): the queue must hold one full wave",
        )
    # The runtime's own rules that span its section and the model's (the ones inside the runtime
    # section ran when it was parsed).
    try:
        runtime_config(model, rt)
    except ValidationError as exc:
        for problem in problems_of(exc):
            yield FieldProblem(_in_pool(problem.path), problem.value, problem.naming(_braced_in_pool))
    yield from _attention_backend_problems(pool)
    yield from _quantization_problems(pool)
    yield from _timeout_chain_problems(s, pool)
    if model.num_attention_heads % tp:
        yield FieldProblem(
            "runtime.tensor_parallel_size",
            tp,
            "must divide {model.num_attention_heads}" + f" ({model.num_attention_heads})",
        )
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        yield FieldProblem(
            "runtime.tensor_parallel_size",
            tp,
            "must divide {model.num_kv_heads}"
            + f" ({model.num_kv_heads}) or be a multiple of it (KV heads are "
            "split across tensor-parallel ranks, or replicated when there are fewer heads than ranks)",
        )
    if model.num_layers % pp:
        yield FieldProblem(
            "runtime.pipeline_parallel_size", pp, "must divide {model.num_layers}" + f" ({model.num_layers})"
        )
    if ep > 1 and model.num_experts == 0:
        yield FieldProblem(
            "runtime.expert_parallel_size", ep, "must be 1 for a dense model ({model.num_experts} = 0)"
        )
    if model.num_experts and model.num_experts % ep:
        yield FieldProblem(
            "runtime.expert_parallel_size", ep, "must divide {model.num_experts}" + f" ({model.num_experts})"
        )
    group = pool.group
    if ep > group.nvlink_domain_gpus:
        yield FieldProblem(
            "runtime.expert_parallel_size",
            ep,
            f"an expert-parallel group must stay inside one NVLink domain: node group {group.name!r} "
            f"has nvlink_domain_gpus = {group.nvlink_domain_gpus}",
        )
    yield from _node_span_problems(pool)


def _pool_fit_problems(s: Settings, pool: PoolSettings) -> Iterator[FieldProblem]:
    """The pool's model on one GPU of its node group, named at the group's memory."""
    fit = memory_fit(pool, pool.group)
    if not fit.fits:
        yield FieldProblem(
            f"node_groups[{s.node_groups.index(pool.group)}].gpu_memory_gb",
            pool.group.gpu_memory_gb,
            "the model does not fit: " + fit.explain(),
        )


def _attention_backend_problems(pool: PoolSettings) -> Iterator[FieldProblem]:
    """A required attention backend the serving hosts cannot run is refused here, not at their start
    (which backend runs where is the runtime's table, ``frontier_runtime.ops.table``)."""
    backend, group, kv = pool.runtime.attention_backend, pool.group, pool.runtime.kv_cache_dtype
    if backend == AUTO:
        return
    device = _device_of(group.accelerator)
    traits = ATTENTION_BACKENDS[backend]
    problem = traits.problem(device)
    if problem:
        yield FieldProblem(
            "runtime.attention_backend",
            backend,
            f"{problem}, and node group {group.name!r} serves on {group.accelerator.upper()}; "
            f"use {_either(AUTO, *attention_backends_on(device))}",
        )
    elif kv != AUTO and (problem := traits.problem(device, kv)):
        yield FieldProblem(
            "runtime.attention_backend",
            backend,
            f"{problem} ({{runtime.kv_cache_dtype}} is {kv!r}); use {_either(AUTO, *attention_backends_on(device, kv))}",
        )


def _quantization_problems(pool: PoolSettings) -> Iterator[FieldProblem]:
    """Weights the serving hosts cannot multiply (fp8's float8 GEMMs are a GPU's) are refused here,
    before any host is touched, as the runtime would refuse them at start (``ops.table`` again)."""
    group, quantization = pool.group, pool.model.quantization
    device = _device_of(group.accelerator)
    problem = QUANTIZATIONS[quantization].problem(device)
    if problem:
        yield FieldProblem(
            "model.quantization",
            quantization,
            f"{problem}, and node group {group.name!r} serves on {group.accelerator}, "
            f"which runs {{model.quantization}} {' or '.join(repr(q) for q in quantizations_on(device))}",
        )


def _device_of(accelerator: str) -> str:
    """The runtime's device type on a node group's hosts."""
    return CPU if accelerator == "cpu" else CUDA


def _either(*names: str) -> str:
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _timeout_chain_problems(s: Settings, pool: PoolSettings) -> Iterator[FieldProblem]:
    """The runtime's queue gives up (503 with retry-after) before whatever waits on it: the gateway's
    upstream request and the balancer's idle timeout (a non-streamed answer sends no byte until it is
    done). Where the balancer fronts the gateway is the target's rule (EC2's ``rules``)."""
    queue_s = pool.runtime.queue.timeout_ms / 1000
    waiting = [("edge.idle_timeout_s", float(s.edge.idle_timeout_s))]
    if s.gateway is not None:
        waiting.append(("gateway.request_timeout_s", s.gateway.request_timeout_s))
    for name, seconds in waiting:
        if queue_s >= seconds:
            yield FieldProblem(
                "runtime.queue.timeout_ms",
                pool.runtime.queue.timeout_ms,
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
        served = [pool.name for pool in s.pools_on(group)]
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
    """The stack's file says ``production: true``: the one answer the programs in infra/, the policy
    pack and these checks read."""
    return s.production


def alert_problems(s: Settings) -> Iterator[FieldProblem]:
    """A production stack's page alarms reach someone: its page route names at least one address."""
    if is_production(s) and s.alert_route("page").empty:
        yield FieldProblem(
            "alerts.routes.page",
            None,
            f"stack {s.stack!r} is a production stack: its page alarms need at least one of emails, "
            "sqs_queue_arns or https_endpoints",
        )


def _node_span_problems(pool: PoolSettings) -> Iterator[FieldProblem]:
    """A replica's ranks over its nodes: each node's share must fit the node, and a pipeline stage
    (a tensor- or expert-parallel group, all-reducing every layer) that spans nodes must stay in one
    NVLink domain (the runtime splits ranks over nodes in order: whole stages when N divides PP)."""
    rt, group = pool.runtime, pool.group
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


def _in_pool(path: str) -> str:
    """A field of the runtime's config where the pool holds it: its model is the pool's."""
    return path if path.startswith("model.") else f"runtime.{path}"


def _braced_in_pool(path: str) -> str:
    """A field the runtime's message names, as a reference the pool's problem writes out in full."""
    return "{" + _in_pool(path) + "}"


def certificate_problems(s: Settings) -> Iterator[FieldProblem]:
    """An edge that AWS terminates TLS on needs an ACM certificate (HTTPS only): the rule of the
    targets whose load balancer is AWS's."""
    if not s.edge.certificate_arn.startswith("arn:aws:acm:"):
        yield FieldProblem(
            "edge.certificate_arn", s.edge.certificate_arn, "must be an ACM certificate ARN (HTTPS only)"
        )


# --- model pools, the gateway and tenants ----------------------------------------------------------

_Key = TypeVar("_Key", bound=Hashable)


def _first_index(values: Iterable[_Key]) -> dict[_Key, int]:
    """Each of ``values`` with the index it first stands at: one standing later repeats it."""
    first: dict[_Key, int] = {}
    for i, value in enumerate(values):
        first.setdefault(value, i)
    return first


def pool_problems(s: Settings) -> Iterator[FieldProblem]:
    """The pools: a unique name each, and a host runs one pool."""
    first_name = _first_index(pool.name for pool in s.pools)
    first_secret = _first_index(pool.runtime.api_keys_secret or "" for pool in s.pools)
    host_owner: dict[str, str] = {}
    listed = len(s.pools) > 1
    for i, pool in enumerate(s.pools):
        where = f"pools[{i}]"
        if (first := first_name[pool.name]) < i:
            yield FieldProblem(
                f"{where}.model.name", pool.name, f"must be unique among models (pools[{first}])"
            )
        # Each pool's principal reads its own pool's key secret and no other's: a secret two pools
        # shared would let one pool's hosts hold the key that reaches the other's runtimes.
        secret = pool.runtime.api_keys_secret or ""
        if (first := first_secret[secret]) < i:
            yield FieldProblem(
                f"{where}.runtime.api_keys_secret",
                secret,
                f"already the secret of pools[{first}] "
                f"({s.pools[first].name!r}): each pool's runtimes read a secret of their own",
            )
        for j, host in enumerate(pool.hosts):
            if listed and host.name in host_owner:
                yield FieldProblem(
                    f"{where}.hosts[{j}]",
                    host.name,
                    f"already runs model {host_owner[host.name]!r}: one pool per host",
                )
            host_owner.setdefault(host.name, pool.name)
    if len(s.pools) > 1 and s.gateway is None:
        yield FieldProblem(
            "gateway", None, f"{len(s.pools)} models need a 'frontier:gateway' section to route by model"
        )
    yield from (
        FieldProblem(
            f"pools[{i}].runtime.kv_events.enabled",
            True,
            "needs runtime.prefix_caching: the events are the prefix cache's changes",
        )
        for i, pool in enumerate(s.pools)
        if pool.runtime.kv_events.enabled and not pool.runtime.prefix_caching
    )
    if s.gateway is None:
        # The stack's gateway is what reads a pool's KV events (its kv_routing is rendered from
        # them); without one they would go out to nobody.
        yield from (
            FieldProblem(
                f"pools[{i}].runtime.kv_events.enabled",
                True,
                "needs a 'frontier:gateway' section: the gateway is what reads the KV events "
                "(it routes the pool by them); without one, leave kv_events off",
            )
            for i, pool in enumerate(s.pools)
            if pool.runtime.kv_events.enabled
        )
    yield from _shared_problems(s)


def _shared_problems(s: Settings) -> Iterator[FieldProblem]:
    """What the stack builds once for all its pools (one image repository, one weights bucket):
    every pool names the same as the one listed first."""

    def shared(pool: PoolSettings) -> dict[str, str | None]:
        return {
            "runtime.image_repository": pool.runtime.image_repository,
            "model.weights_uri": pool.model.weights_uri.removeprefix("s3://").split("/", 1)[0],
        }

    written_first, *others = s.pools
    first = shared(written_first)
    for i, pool in enumerate(others, start=1):
        for field, value in shared(pool).items():
            if value != first[field]:
                yield FieldProblem(
                    f"pools[{i}].{field}",
                    value,
                    f"must be {first[field]!r}, as pools[0]'s: the stack builds one for all its pools",
                )


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
    first_name = _first_index(tenant.name for tenant in s.tenants)
    first_secret = _first_index(tenant.api_key_secret for tenant in s.tenants)
    for i, tenant in enumerate(s.tenants):
        where = f"tenants[{i}]"
        if (first := first_name[tenant.name]) < i:
            yield FieldProblem(
                f"{where}.name", tenant.name, f"must be unique among tenants (tenants[{first}])"
            )
        if (first := first_secret[tenant.api_key_secret]) < i:
            yield FieldProblem(
                f"{where}.api_key_secret",
                tenant.api_key_secret,
                f"must differ from tenants[{first}]'s: a key identifies one tenant",
            )
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
