"""Sweep a stack's serving settings and keep the price-latency Pareto front.

Candidates are instance type x tensor parallel x max_batch_size (x kv_cache_dtype fp8 where the
runtime accepts it), everything else as the stack has it. Each candidate is the stack with those
fields changed, checked by the same rules a stack file is (``frontier.targets.stack_problems``:
memory fit, topology, batching, and the target's own, e.g. a model cache needs instance store), then
modelled by the roofline (``roofline.py``) at the largest concurrency meeting every SLO, and sized
for the stack's peak by the planner (``plan.py``). What fails says why, counted per reason.

Mixture-of-experts models also sweep expert parallel (EP: each divisor of the expert count up to
TP, the experts spread over the tensor-parallel group's GPUs) and pipeline parallel (PP 1, 2, 4
where it divides the layers; the rules keep TP x PP inside a node). Dense stacks keep their own EP
and PP: inside one node TP on NVLink serves a dense model's decode without PP's bubbles.
``expert_parallel_sweep`` then takes the stack's own choice and widens EP past the NVLink domain
(the stage grows to EP GPUs over several nodes, attention data-parallel over them): the rows where
the all-to-all crosses the network, modelled even where the stack rules refuse them, show what
leaving the domain costs.

kv_cache_dtype: the sweep asks the runtime which KV cache dtypes its engine accepts
(``frontier_runtime.engine.config``) rather than assuming. Only fp8 is worth sweeping — half the KV
bytes of bf16, so larger batches fit and decode reads less; the other dtypes are no narrower than
the model's own. Where the engine refuses fp8, the sweep keeps the stack's dtype and says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from frontier_runtime.ops.table import QUANTIZATIONS
from frontier_settings import FieldProblem

from frontier.capacity.devices import gpu_device
from frontier.capacity.gpus import GPUS, INSTANCES, gpu_spec
from frontier.capacity.plan import GroupPlan, Throughput, plan_with
from frontier.capacity.quantization_speed import speed_of, why_not_recommended
from frontier.capacity.replica import ReplicaModel
from frontier.capacity.roofline import (
    GPU_EFFICIENCY,
    Device,
    Efficiency,
    OperatingPoint,
    Replica,
    Shape,
    fit_slo,
)
from frontier.config.hardware import instance_store
from frontier.config.schema import GB, NodeGroup, PoolSettings, Settings
from frontier.errors import FrontierError

TENSOR_PARALLEL = (1, 2, 4, 8)
MAX_BATCH_SIZES = (8, 16, 32, 64, 128, 256)
EXPERT_PARALLEL = (1, 2, 4, 8)
PIPELINE_PARALLEL = (1, 2, 4)
# How far past the NVLink domain expert_parallel_sweep widens EP: up to this many domains.
EP_DOMAINS = 4


def runtime_kv_cache_dtypes() -> tuple[str, ...]:
    """The KV cache dtypes this project's engine accepts, asked of the engine itself."""
    from frontier_runtime.engine import config as engine  # imports torch: only a sweep pays for it

    return tuple(getattr(engine, "KV_CACHE_DTYPES", ("auto", *engine.DTYPE_NAMES)))


def kv_dtypes_to_sweep(pool: PoolSettings, accepted: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The pool's KV cache dtype, plus fp8 where the engine accepts it; and a note saying which."""
    own = pool.runtime.kv_cache_dtype
    if own == "fp8":
        return (own,), "kv_cache_dtype is the stack's own, fp8, the narrowest there is"
    if "fp8" in accepted:
        return (
            own,
            "fp8",
        ), f"kv_cache_dtype swept over {own} and fp8 (the runtime accepts fp8: half the KV bytes)"
    return (own,), (
        f"kv_cache_dtype is not swept: the runtime refuses fp8 (it accepts {', '.join(accepted)}) and the "
        "others are no narrower than the model's dtype"
    )


@dataclass(frozen=True)
class Candidate:
    instance_type: str
    gpu_type: str
    tensor_parallel: int
    max_batch_size: int
    kv_cache_dtype: str
    pipeline_parallel: int = 1
    expert_parallel: int = 1
    quantization: str = "none"  # model.quantization: the weights' format

    @property
    def label(self) -> str:
        kv = " kv-fp8" if self.kv_cache_dtype == "fp8" else ""
        pp = f" PP{self.pipeline_parallel}" if self.pipeline_parallel > 1 else ""
        ep = f" EP{self.expert_parallel}" if self.expert_parallel > 1 else ""
        weights = f" w-{self.quantization}" if QUANTIZATIONS[self.quantization].quantized else ""
        return f"{self.instance_type} TP{self.tensor_parallel}{pp}{ep} mbs{self.max_batch_size}{kv}{weights}"


@dataclass(frozen=True)
class Option:
    """A candidate that fits and meets every SLO: its best point and its fleet for the peak."""

    candidate: Candidate
    point: OperatingPoint
    plan: GroupPlan
    current: bool

    @property
    def cost_per_million(self) -> float:
        """One replica at its best SLO point, paying its share of the node."""
        return self.plan.cost_per_million_output_tokens

    @property
    def tpot_ms(self) -> float:
        return self.point.tpot_s * 1e3


@dataclass(frozen=True)
class Exploration:
    stack: str
    considered: int
    options: tuple[Option, ...]  # every candidate meeting every SLO
    front: tuple[Option, ...]  # the Pareto front of cost per 1M output tokens vs TPOT, cheapest first
    dropped: tuple[tuple[str, int], ...]  # reason, count; most frequent first
    current: Option | None
    current_dropped: str | None  # why the stack's own choice is not an option, when it is not
    kv_note: str

    @property
    def cheapest(self) -> Option:
        return self.front[0]


def parallel_layouts(pool: PoolSettings, tp: int) -> list[tuple[int, int]]:
    """(PP, EP) pairs swept at tensor parallel ``tp``: the pool's own, plus, for a MoE model, PP that
    divides the layers and EP that divides the experts and fits the tensor-parallel group."""
    model, rt = pool.model, pool.runtime
    own = (rt.pipeline_parallel_size, rt.expert_parallel_size)
    if not model.num_experts:
        return [own]
    pps = [pp for pp in PIPELINE_PARALLEL if model.num_layers % pp == 0]
    eps = [ep for ep in EXPERT_PARALLEL if ep <= tp and model.num_experts % ep == 0 and tp % ep == 0]
    layouts = {(pp, ep) for pp in pps for ep in eps}
    if own[1] <= tp and tp % own[1] == 0:
        layouts.add(own)
    return sorted(layouts)


def candidates(
    pool: PoolSettings,
    kv_dtypes: tuple[str, ...] | None = None,
    quantizations: tuple[str, ...] | None = None,
) -> list[Candidate]:
    """Every instance type of the table (and the pool's own) x TP x max_batch_size x KV dtype
    x weight quantization (x PP x EP for a MoE model)."""
    group, rt = pool.group, pool.runtime
    instances = {name: (i.gpu, i.gpus_per_node) for name, i in INSTANCES.items()}
    instances[group.instance_type] = (group.gpu_type, group.gpus_per_node)
    batch_sizes = sorted({*MAX_BATCH_SIZES, rt.batch.max_batch_size})
    return [
        Candidate(name, gpu, tp, mbs, kv, pp, ep, q)
        for name, (gpu, gpus) in sorted(instances.items())
        for tp in sorted({*TENSOR_PARALLEL, rt.tensor_parallel_size})
        for pp, ep in parallel_layouts(pool, tp)
        for mbs in batch_sizes
        for kv in kv_dtypes or (rt.kv_cache_dtype,)
        for q in quantizations or (_quantization(pool),)
    ]


def _quantization(pool: PoolSettings) -> str:
    return str(getattr(pool.model, "quantization", "none"))


def variant(settings: Settings, pool: PoolSettings, c: Candidate) -> Settings:
    """The stack with ``pool`` on the candidate's instance, TP and max_batch_size (queue and
    concurrency widened to hold it); ``.pool(pool.name)`` of it is the pool as the candidate has it."""
    group, rt = pool.group, pool.runtime
    if c.instance_type == group.instance_type:
        new_group = group  # the stack's own price and sizes win over the table
    else:
        inst, spec = INSTANCES[c.instance_type], GPUS[c.gpu_type]
        new_group = group.model_copy(
            update={
                "instance_type": inst.name,
                "gpu_type": inst.gpu,
                "accelerator": "gpu",
                "gpus_per_node": inst.gpus_per_node,
                "gpu_memory_gb": spec.memory_gb,
                "nvlink_domain_gpus": inst.nvlink_domain_gpus,
                "price_per_hour": inst.price_per_hour,
                # Where the weights cache lives changes start-up, not serving: a type without
                # instance-store NVMe keeps it on EBS instead of being dropped.
                "model_cache": group.model_cache if instance_store(inst.name)[0] else "ebs",
            }
        )
    concurrency = max(rt.max_concurrency, c.max_batch_size)
    new_rt = rt.model_copy(
        update={
            "tensor_parallel_size": c.tensor_parallel,
            "pipeline_parallel_size": c.pipeline_parallel,
            "expert_parallel_size": c.expert_parallel,
            "max_concurrency": concurrency,
            "queue": rt.queue.model_copy(update={"max_length": max(rt.queue.max_length, concurrency)}),
            "batch": rt.batch.model_copy(update={"max_batch_size": c.max_batch_size}),
            "kv_cache_dtype": c.kv_cache_dtype,
        }
    )
    update: dict[str, object] = {"group": new_group, "runtime": new_rt}
    if c.quantization != _quantization(pool):
        update["model"] = pool.model.model_copy(update={"quantization": c.quantization})
    return settings.with_pool(pool.model_copy(update=update))


def reason_of(problem: FieldProblem) -> str:
    """A reason that groups alike problems (the figures in the message differ per candidate)."""
    # A candidate is one pool's stack: its fields are named as a one-model file writes them.
    problem = FieldProblem(
        problem.path.removeprefix("pools[0]."),
        problem.value,
        problem.message,
        problem.scope.removeprefix("pools[0]"),
    )
    if problem.path.endswith(".gpu_memory_gb"):
        return "memory: weights + KV cache for max_batch_size x max_seq_len exceed the GPU's budget"
    if problem.path == "runtime.nodes_per_replica" and "GPUs per node" in problem.message:
        if "pipeline (1) x" in problem.message:
            return "topology: tensor parallel needs more GPUs than a node has"
        return "topology: tensor x pipeline parallel needs more GPUs than a node has"
    if problem.path == "runtime.expert_parallel_size" and "NVLink domain" in problem.message:
        return "topology: expert parallel larger than the NVLink domain"
    if problem.path == "runtime.tensor_parallel_size":
        return "topology: tensor parallel does not divide the model's heads"
    return f"{problem.path}: {problem.text}"


def _slo_reason(broken: tuple[str, ...]) -> str:
    fields = ", ".join(b.split(" ")[0] for b in broken)
    return f"SLO: one request at a time already breaks {fields}"


def explore(
    settings: Settings,
    pool: PoolSettings,
    current_model: ReplicaModel,
    accepted_kv_dtypes: tuple[str, ...] | None = None,
    *,
    rules: Callable[[Settings], Iterable[FieldProblem]],
    quantizations: tuple[str, ...] | None = None,
) -> Exploration:
    """Sweep ``pool``'s serving settings, drop what does not fit or meet the SLOs, and return the
    options and their front.

    ``current_model`` is the pool's own replica (its device and, where a baseline exists,
    calibrated efficiencies): the stack's own instance type is modelled with those, the others with
    their datasheets and the default GPU efficiencies. ``accepted_kv_dtypes`` defaults to what the
    runtime's engine accepts. ``rules`` are the stack file's (``frontier.targets.stack_problems``):
    a candidate that breaks one is dropped, counted under the first it breaks. ``quantizations``
    (model.quantization values) adds the weights' format as an axis; by default the stack's own.
    """
    accepted = accepted_kv_dtypes if accepted_kv_dtypes is not None else runtime_kv_cache_dtypes()
    kv_dtypes, kv_note = kv_dtypes_to_sweep(pool, accepted)
    cap, slo = settings.capacity, settings.slo
    group, dtype, rt = pool.group, pool.model.dtype, pool.runtime
    current_key = (
        group.instance_type,
        rt.tensor_parallel_size,
        rt.batch.max_batch_size,
        rt.kv_cache_dtype,
        rt.pipeline_parallel_size,
        rt.expert_parallel_size,
        _quantization(pool),
    )
    dropped: Counter[str] = Counter()
    options: list[Option] = []
    current_dropped = None
    all_candidates = candidates(pool, kv_dtypes, quantizations)
    for c in all_candidates:
        is_current = (
            c.instance_type,
            c.tensor_parallel,
            c.max_batch_size,
            c.kv_cache_dtype,
            c.pipeline_parallel,
            c.expert_parallel,
            c.quantization,
        ) == current_key
        s = variant(settings, pool, c)
        problems = list(rules(s))
        device_kind = (
            "cpu" if c.instance_type == group.instance_type and group.accelerator == "cpu" else "cuda"
        )
        slower = why_not_recommended(device_kind, dtype, c.quantization)
        if problems or slower:
            reason = reason_of(problems[0]) if problems else slower
            dropped[reason] += 1
            if is_current:
                current_dropped = reason
            continue
        device, eff, replica = option_device(group, dtype, current_model, c, s.pool(pool.name))
        fit = fit_slo(device, eff, replica, slo, cap.avg_prompt_tokens, cap.avg_output_tokens)
        if fit.best is None:
            reason = _slo_reason(fit.broken_at_1)
            dropped[reason] += 1
            if is_current:
                current_dropped = reason
            continue
        best = fit.best
        throughput = Throughput(best.requests_per_s, best.output_tokens_per_s, "roofline", None, c.label)
        options.append(Option(c, best, plan_with(s, s.pool(pool.name), throughput).groups[0], is_current))
    reasons = tuple(sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])))
    if not options:
        counts = "; ".join(f"{n} x {reason}" for reason, n in reasons)
        raise FrontierError(
            f"stack {settings.stack}: none of the {len(all_candidates)} candidates (instance type x "
            f"tensor_parallel_size x max_batch_size x kv_cache_dtype {'/'.join(kv_dtypes)}) fits and meets "
            f"every SLO: {counts}"
        )
    current = next((o for o in options if o.current), None)
    return Exploration(
        stack=settings.stack,
        considered=len(all_candidates),
        options=tuple(options),
        front=pareto_front(options),
        dropped=reasons,
        current=current,
        current_dropped=current_dropped,
        kv_note=kv_note,
    )


def option_device(
    group: NodeGroup, dtype: str, current_model: ReplicaModel, c: Candidate, candidate_pool: PoolSettings
) -> tuple[Device, Efficiency, Replica]:
    """The device, efficiencies and replica a candidate (``candidate_pool``: the pool as the
    candidate has it, of :func:`variant`) is modelled with: the pool's own instance type (``group``) as
    ``current_model`` has it (measured or calibrated where it is), the others from their datasheets
    and the default GPU efficiencies; quantized weights held to their measured speed."""
    if c.instance_type == group.instance_type:
        device, eff = current_model.device, current_model.efficiency
    else:
        device, eff = gpu_device(gpu_spec(c.gpu_type), dtype), GPU_EFFICIENCY
    device_kind = "cpu" if c.instance_type == group.instance_type and group.accelerator == "cpu" else "cuda"
    replica = Replica.from_pool(candidate_pool)
    return device, measured_quantization(eff, replica.shape, device_kind, dtype, c.quantization), replica


def measured_quantization(
    eff: Efficiency, shape: Shape, device_kind: str, dtype: str, method: str
) -> Efficiency:
    """A quantized replica's efficiency (``shape``: its model as quantized) held to the method's
    measured speed: the roofline would credit the narrow weights with their whole byte saving, the
    table says what the engine turns it into."""
    speed = speed_of(device_kind, dtype, method)
    if speed is None or not QUANTIZATIONS[method].quantized:
        return eff
    bytes_ratio = shape.dense_bytes / replace(shape, projection_bytes=0.0).dense_bytes
    bandwidth = min(eff.bandwidth, eff.bandwidth * speed.factor * bytes_ratio)
    return replace(
        eff,
        bandwidth=bandwidth,
        source=f"{eff.source}; {method} weights held to their measured {speed.factor:.2f}x",
    )


def why_no_option(ex: Exploration, quantization: str) -> str:
    """Why a weights format has no option: not offered where it was measured slower (or never
    measured), else none of its candidates met every SLO."""
    prefix = f"quantization: {quantization} weights "
    offered = next((reason for reason, _ in ex.dropped if reason.startswith(prefix)), "")
    return f"not offered: {offered.removeprefix(prefix)}" if offered else "no option meets every SLO"


def pareto_front(options: list[Option]) -> tuple[Option, ...]:
    """Options no other is both cheaper (per 1M output tokens) and faster (TPOT) than; cheapest first.

    Ties on cost keep the lower TPOT; ties on both keep the cheaper fleet at the peak.
    """
    ranked = sorted(options, key=lambda o: (o.cost_per_million, o.tpot_ms, o.plan.cost_per_hour))
    front: list[Option] = []
    for option in ranked:
        if not front or option.tpot_ms < front[-1].tpot_ms:
            front.append(option)
    return tuple(front)


@dataclass(frozen=True)
class ExpertParallelRow:
    """The stack's replica with expert parallel ``expert_parallel``: where its all-to-all runs and
    what that does to latency and cost (or why it does not fit)."""

    expert_parallel: int
    gpus: int  # of one replica: PP x max(TP, EP)
    nodes: int  # that one replica spans
    inside_nvlink: bool
    max_batch_size: int  # the stack's, times the attention groups
    weights_gb_per_gpu: float
    point: OperatingPoint | None  # the best SLO point; None when it does not fit or meets no SLO
    alltoall_ms: float  # per step at that point
    cost_per_million: float | None
    rules: str  # "ok", or the first stack rule the layout breaks
    why_not: str = ""  # does not fit, or breaks an SLO at one request

    @property
    def where(self) -> str:
        if self.expert_parallel == 1:
            return "no all-to-all"
        if self.inside_nvlink:
            return "NVLink"
        return f"network, {self.nodes} nodes"


def expert_parallel_sweep(
    settings: Settings,
    pool: PoolSettings,
    current_model: ReplicaModel,
    *,
    rules: Callable[[Settings], Iterable[FieldProblem]],
) -> tuple[ExpertParallelRow, ...]:
    """``pool``'s replica at each EP dividing the experts, up to ``EP_DOMAINS`` NVLink domains.

    Past the tensor-parallel group the stage grows to EP GPUs and attention runs data-parallel over
    them, so each EP / TP attention group brings its own batch (max_batch_size, the token budget and
    the concurrency scale with it) and the experts per GPU fall: the rows compare the same per-GPU
    load, inside the domain and across the network. Weights per GPU here count the experts over
    EP (the stack rules' memory fit divides every weight by TP x PP only).
    """
    model, rt, group = pool.model, pool.runtime, pool.group
    if not model.num_experts:
        return ()
    base = current_model.replica
    limit = EP_DOMAINS * group.nvlink_domain_gpus
    rows = []
    for ep in (e for e in range(1, model.num_experts + 1) if model.num_experts % e == 0):
        g = max(base.tensor_parallel, ep)
        if g > limit or g % min(base.tensor_parallel, ep):
            continue
        groups = g // base.tensor_parallel
        replica = replace(
            base,
            expert_parallel=ep,
            max_batch_size=base.max_batch_size * groups,
            max_num_batched_tokens=base.max_num_batched_tokens * groups,
            max_concurrency=base.max_concurrency * groups,
        )
        s = settings.with_pool(
            pool.model_copy(
                update={
                    "runtime": rt.model_copy(
                        update={
                            "expert_parallel_size": ep,
                            # As many nodes as the replica's GPUs take: what is left to judge is the domain.
                            "nodes_per_replica": math.ceil(replica.gpus / group.gpus_per_node),
                            "max_concurrency": replica.max_concurrency,
                            "queue": rt.queue.model_copy(
                                update={"max_length": max(rt.queue.max_length, replica.max_concurrency)}
                            ),
                            "batch": rt.batch.model_copy(
                                update={
                                    "max_batch_size": replica.max_batch_size,
                                    "max_num_batched_tokens": replica.max_num_batched_tokens,
                                }
                            ),
                        }
                    )
                }
            )
        )
        broken = list(rules(s))
        # The layout's own problem first (a rollout's sizes, say, follow from it and say less).
        first = next(
            (b for b in broken if b.path.startswith("pools[0].runtime.")), broken[0] if broken else None
        )
        rule = (
            "ok" if first is None else f"{first.path} = {first.value}: {first.text}".replace("pools[0].", "")
        )
        weights, budget, kv = _ep_memory(pool, replica)
        nodes = -(-replica.gpus // group.gpus_per_node)
        row = ExpertParallelRow(
            expert_parallel=ep,
            gpus=replica.gpus,
            nodes=nodes,
            inside_nvlink=g <= group.nvlink_domain_gpus,
            max_batch_size=replica.max_batch_size,
            weights_gb_per_gpu=weights / GB,
            point=None,
            alltoall_ms=0.0,
            cost_per_million=None,
            rules=rule,
        )
        if weights + kv > budget:
            why = (
                f"does not fit: {weights / GB:,.1f} GB of weights + {kv / GB:,.1f} GB of KV per GPU > "
                f"{budget / GB:,.1f} GB"
            )
            rows.append(replace(row, why_not=why))
            continue
        fit = fit_slo(
            current_model.device,
            current_model.efficiency,
            replica,
            settings.slo,
            settings.capacity.avg_prompt_tokens,
            settings.capacity.avg_output_tokens,
        )
        if fit.best is None:
            rows.append(replace(row, why_not=_slo_reason(fit.broken_at_1)))
            continue
        best = fit.best
        throughput = Throughput(best.requests_per_s, best.output_tokens_per_s, "roofline", None, f"EP {ep}")
        plan = plan_with(s, s.pool(pool.name), throughput).groups[0]
        rows.append(
            replace(
                row,
                point=best,
                alltoall_ms=best.mean_step.alltoall_s * 1e3,
                cost_per_million=plan.cost_per_million_output_tokens,
            )
        )
    return tuple(rows)


def _ep_memory(pool: PoolSettings, replica: Replica) -> tuple[float, float, float]:
    """Weights per GPU (dense over TP x PP, experts over the stage's G GPUs and PP), the GPU's budget,
    and the KV its attention group's max_batch_size x max_seq_len need."""
    sh, group, rt = replica.shape, pool.group, pool.runtime
    pp, g = replica.pipeline_parallel, replica.stage_gpus
    dense = sh.dense_bytes / (replica.tensor_parallel * pp)
    experts = sh.layers * sh.experts * sh.expert_parameters * sh.weight_bytes / (pp * g)
    budget = group.gpu_memory_gb * GB * rt.gpu_memory_utilization - rt.reserved_memory_gb * GB
    per_group = replica.max_batch_size / replica.attention_groups
    kv = per_group * pool.model.max_seq_len * replica.kv_bytes_per_token_per_gpu
    return dense + experts, budget, kv
