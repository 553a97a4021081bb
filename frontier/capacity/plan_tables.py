"""The planner's tables: what ``fab plan`` prints, built here and printed by the task.

Each report is a sequence of lines and :class:`Table` s, in the order they are printed: the fleet
sized per node group (:func:`fleet_report`), one replica's roofline (:func:`roofline_report`) and,
for ``--explore``, the sweep of serving settings with its charts (:func:`exploration_report`).
Reports are generators, so a long step (measuring pass rates) shows its progress between the lines
before it and after it. Nothing here knows how a table is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from frontier_settings import FieldProblem

from frontier.capacity.chart import expert_parallel_png, pareto_png, quality_png
from frontier.capacity.disaggregation import Choice, Layout, choose
from frontier.capacity.explore import (
    MAX_BATCH_SIZES,
    TENSOR_PARALLEL,
    ExpertParallelRow,
    Exploration,
    Option,
    expert_parallel_sweep,
    explore,
    parallel_layouts,
    why_no_option,
)
from frontier.capacity.gpus import INSTANCES
from frontier.capacity.plan import GroupPlan, Plan, plan_with
from frontier.capacity.quality import (
    WEIGHTS,
    QualityPoint,
    QualityRun,
    measure,
    quality_points,
    variants_to_measure,
)
from frontier.capacity.replica import ReplicaModel
from frontier.capacity.roofline import OperatingPoint, slo_violations
from frontier.config.schema import PoolSettings, Settings
from frontier.figures import count, money, size

# The stack's own rules a swept candidate must pass (the caller's: capacity/ knows no target).
Rules = Callable[[Settings], Iterable[FieldProblem]]


@dataclass(frozen=True)
class Table:
    """A titled table; the columns whose indexes are in ``numeric`` hold figures (right-aligned)."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[object]]
    numeric: Sequence[int] = ()


Report = Table | str


def fleet_report(settings: Settings, pool: PoolSettings, result: Plan) -> Iterator[Report]:
    """``pool``'s GPU memory fit, replicas, nodes and cost per node group, sized from the measured
    baseline (else the stated assumption)."""
    model, rt = pool.model, pool.runtime
    yield (
        f"stack {settings.stack}: {model.name} ({count(model.num_parameters)} parameters, {model.dtype}), "
        f"TP {rt.tensor_parallel_size} x PP {rt.pipeline_parallel_size} x EP {rt.expert_parallel_size}, "
        f"max_batch_size {rt.batch.max_batch_size} x max_seq_len {model.max_seq_len}"
    )
    yield f"per-replica throughput: {result.throughput.explanation}"
    for group_plan in result.groups:
        yield memory_table(group_plan)
        yield capacity_table(result, group_plan, settings)
        for warning in group_plan.warnings:
            yield f"warning: {warning}"


def memory_table(p: GroupPlan) -> Table:
    m, g = p.memory, p.group
    device = "GPU" if g.accelerator == "gpu" else "device (CPU)"
    rows = [
        (f"{device} memory", size(m.gpu_memory_bytes), f"one {g.gpu_type}"),
        (
            "budget",
            size(m.budget_bytes),
            f"runtime.gpu_memory_utilization {m.utilization} x GPU memory",
        ),
        ("weights (whole model)", size(m.weights_bytes), "parameters x bytes per parameter"),
        ("weights per GPU", size(m.weights_per_gpu_bytes), f"/ {p.gpus_per_replica} GPUs (TP x PP)"),
        (
            "KV bytes per token (model)",
            f"{m.kv_bytes_per_token:,} B",
            "2 x layers x kv_heads x head_dim x bytes",
        ),
        ("KV bytes per token per GPU", f"{m.kv_bytes_per_token_per_gpu:,} B", "KV heads / TP, layers / PP"),
        (
            "KV needed",
            size(m.kv_required_bytes),
            f"{m.kv_tokens_required:,} tokens = max_batch_size x max_seq_len",
        ),
        (
            "reserved",
            size(m.reserved_bytes),
            "runtime.reserved_memory_gb: activations, graphs, workspace",
        ),
        ("headroom", size(m.headroom_bytes), "budget - weights - KV needed - reserved"),
        (
            "KV capacity",
            f"{m.kv_capacity_tokens:,} tokens",
            "(budget - weights - reserved) / KV bytes per token per GPU",
        ),
    ]
    return Table(f"node group {g.name}: memory of one {device}", ("item", "value", "how"), rows, numeric=(1,))


def capacity_table(result: Plan, p: GroupPlan, settings: Settings, title_suffix: str = "") -> Table:
    t, g, cap = result.throughput, p.group, settings.capacity
    source = {
        "baseline": "measured baseline",
        "assumption": "ASSUMPTION (capacity.assumed_replica_qps)",
        "roofline": "MODELLED (roofline)",
    }[t.source]
    rows = [
        (
            "demand",
            f"{p.demand_qps:,.2f} req/s",
            f"capacity.peak_qps {cap.peak_qps:g} x safety_factor {cap.safety_factor:g}",
        ),
        ("per-replica throughput", f"{t.replica_qps:,.2f} req/s", source),
        ("replicas for the peak", str(p.replicas_for_peak), "ceil(demand / per-replica throughput)"),
        ("rolling-upgrade spare", str(p.spare.replicas), f"{p.spare.hosts} host(s): {p.spare.reason}"),
        ("replicas", str(p.replicas), "for the peak + spare"),
        (
            "GPUs per replica",
            str(p.gpus_per_replica),
            "PP x max(TP, EP)" + (f": {p.nodes_per_replica} nodes" if p.nodes_per_replica > 1 else ""),
        ),
        (
            "replicas per node",
            str(p.replicas_per_node),
            f"{g.gpus_per_node} GPUs per node, {p.idle_gpus_per_node} idle",
        ),
        (
            "nodes",
            str(p.nodes),
            f"{g.instance_type}; group min/desired/max {g.min_size}/{g.desired_size}/{g.max_size}",
        ),
        ("cost per hour", money(p.cost_per_hour), f"nodes x ${g.price_per_hour:g}/h"),
        ("output tokens/s per replica", f"{t.output_tokens_per_s:,.0f}", source),
        (
            "cost per 1M output tokens",
            money(p.cost_per_million_output_tokens),
            f"one replica at full load (${p.replica_cost_per_hour:,.2f}/h)",
        ),
        (
            "cost per 1M output tokens at peak",
            money(p.fleet_cost_per_million_output_tokens),
            f"whole fleet at peak_qps x avg_output_tokens ({cap.avg_output_tokens})",
        ),
    ]
    return Table(
        f"node group {g.name}: replicas, nodes and cost{title_suffix}",
        ("item", "value", "how"),
        rows,
        numeric=(1,),
    )


def _concurrency_grid(model: ReplicaModel) -> list[int]:
    top = model.replica.max_concurrency
    grid = {1, top, model.replica.max_batch_size}
    grid.update(2**i for i in range(1, 20) if 2**i < top)
    if model.fit.best is not None:
        grid.add(model.fit.best.concurrency)
    return sorted(c for c in grid if c <= top)


def _point_row(p: OperatingPoint, settings: Settings, mark: str = "") -> tuple[object, ...]:
    broken = slo_violations(p, settings.slo)
    return (
        f"{p.concurrency}{mark}",
        p.batch,
        f"{p.ttft_s * 1e3:,.0f}",
        f"{p.tpot_s * 1e3:,.1f}",
        f"{p.e2e_s * 1e3:,.0f}",
        f"{p.output_tokens_per_s:,.0f}",
        f"{p.requests_per_s:,.2f}",
        p.mean_step.bound + (", budget" if p.budget_bound else ""),
        "ok" if not broken else "breaks " + ", ".join(broken),
    )


def roofline_report(settings: Settings, pool: PoolSettings, model: ReplicaModel) -> Iterator[Report]:
    """One replica of ``pool``: its roofline, the model's figures, the operating points, and the fleet sized from it."""
    d, e, r = model.device, model.efficiency, model.replica
    yield (
        f"roofline of one replica: {r.gpus} x {d.name}, {size(d.bandwidth)}/s, "
        f"{d.flops / 1e12:,.3g} TFLOP/s, link {size(d.link_bandwidth)}/s ({d.source})"
    )
    yield (
        f"efficiencies: bandwidth {e.bandwidth:g}, FLOPs {e.flops:g}, link {e.link:g}, all-reduce latency "
        f"{e.allreduce_latency_s * 1e6:g} us, overhead {e.step_overhead_s * 1e3:.3g} ms/step + "
        f"{e.layer_overhead_s * 1e3:.3g} ms/layer + {e.seq_overhead_s * 1e3:.3g} ms/sequence ({e.source})"
    )
    best = model.fit.best
    if best is not None and (r.shape.experts or r.pipeline_parallel > 1):
        st = best.mean_step
        yield (
            f"roofline: at the best point a step of {st.tokens:,.1f} tokens in {st.microbatches} micro-batch(es): "
            f"all-to-all {st.alltoall_s * 1e3:,.2f} ms, pipeline bubble {st.bubble_s * 1e3:,.2f} ms, of "
            f"{st.total_s * 1e3:,.2f} ms"
        )
    rows = [
        _point_row(p, settings, " (best)" if best is not None and p.concurrency == best.concurrency else "")
        for p in (model.fit.curve[c - 1] for c in _concurrency_grid(model))
    ]
    yield (
        Table(
            f"roofline: one replica at each concurrency ({model.prompt} prompt + {model.output} output tokens; "
            "means, modelled)",
            ("concurrency", "batch", "TTFT ms", "TPOT ms", "E2E ms", "out tok/s", "req/s", "bound", "SLO"),
            rows,
            numeric=(0, 1, 2, 3, 4, 5, 6),
        )
    )
    cal = model.calibration
    measured = (
        "-" if cal is None else f"{cal.baseline.replica_qps:,.2f} req/s (baseline {cal.baseline.measured_at})"
    )
    figures = [
        (
            "device bandwidth, FLOP/s",
            "measured (micro-benchmark)" if d.source.startswith("measured") else "datasheet",
        ),
        ("efficiencies, engine overhead", "calibrated" if cal is not None and cal.fitted else "modelled"),
        ("TTFT, TPOT, throughput per concurrency", "modelled"),
        (
            "knee (req/s per replica)",
            f"modelled {cal.calibrated_qps if cal else (best.requests_per_s if best else 0):,.2f}"
            + (f", uncalibrated {cal.modelled_qps:,.2f}" if cal else "")
            + f"; measured {measured}",
        ),
    ]
    if cal is not None:
        figures.append(("calibration", cal.note))
    yield Table("roofline: which figures are modelled and which measured", ("figure", "source"), figures)
    throughput = model.throughput()
    if throughput is None:
        yield (
            "roofline: no concurrency meets the SLOs; even one request at a time breaks "
            + ", ".join(model.fit.broken_at_1)
        )
        return
    yield f"per-replica throughput from the roofline: {throughput.explanation}"
    modelled = plan_with(settings, pool, throughput)
    yield capacity_table(modelled, modelled.groups[0], settings, " (from the roofline)")


def _per_million(value: float) -> str:
    """Dollars per 1M tokens: cents, or three significant figures below ten cents (tiny models)."""
    return money(value) if value >= 0.1 else f"${value:.3g}"


_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_MARKS = {
    (True, True): "current, cheapest",
    (True, False): "current",
    (False, True): "cheapest",
    (False, False): "",
}


def _price_source(o: Option) -> str:
    inst = INSTANCES.get(o.candidate.instance_type)
    return "the stack's own" if o.current or inst is None else inst.price_source


def _option_row(o: Option, ex: Exploration, mark: str | None = None, moe: bool = False) -> tuple[object, ...]:
    p, g = o.point, o.plan
    estimate = _price_source(o).startswith("ESTIMATE")
    c = o.candidate
    return (
        mark if mark is not None else _MARKS[(o.current, o is ex.cheapest)],
        c.instance_type,
        f"{c.tensor_parallel}/{c.pipeline_parallel}/{c.expert_parallel}" if moe else c.tensor_parallel,
        o.candidate.max_batch_size,
        _SHORT_DTYPES.get(o.candidate.kv_cache_dtype, o.candidate.kv_cache_dtype),
        c.quantization,
        p.concurrency,
        f"{p.ttft_s * 1e3:,.0f}",
        f"{p.tpot_s * 1e3:,.1f}",
        f"{p.output_tokens_per_s:,.0f}",
        _per_million(o.cost_per_million),
        g.replicas,
        g.nodes,
        ("~" if estimate else "") + money(g.cost_per_hour),
    )


def exploration_report(
    settings: Settings,
    pool: PoolSettings,
    model: ReplicaModel,
    rules: Rules,
    chart: Path,
    quality_workdir: Path | None = None,
    on_progress: Callable[[str], object] = print,
) -> Iterator[Report]:
    """The sweep of ``pool``'s serving settings: what was dropped, the Pareto front of price vs TPOT, the
    cheapest choices, and their charts beside ``chart``; with ``quality_workdir``, each weights x KV
    cache variant's pass rate measured there first (``on_progress`` hears how the measuring goes)."""
    ex = explore(settings, pool, model, rules=rules, quantizations=WEIGHTS)
    moe, rt = bool(pool.model.num_experts), pool.runtime
    layouts = (
        " x (pipeline, expert) parallel "
        + ", ".join(f"{pp}/{ep}" for pp, ep in parallel_layouts(pool, 8))
        + " (EP <= TP)"
        if moe
        else ""
    )
    yield (
        f"explore: {ex.considered} candidates = instance types x tensor_parallel_size "
        f"{sorted({*TENSOR_PARALLEL, rt.tensor_parallel_size})}{layouts} x max_batch_size "
        f"{sorted({*MAX_BATCH_SIZES, rt.batch.max_batch_size})} x kv_cache_dtype x model.quantization "
        f"{'/'.join(WEIGHTS)}; "
        f"{len(ex.options)} fit and meet every "
        f"SLO; {ex.kv_note}"
    )
    yield (
        Table(
            "explore: candidates dropped, by the first rule they break",
            ("reason", "candidates"),
            ex.dropped,
            numeric=(1,),
        )
    )
    rows = [_option_row(o, ex, moe=moe) for o in ex.front]
    if ex.current is not None and ex.current not in ex.front:
        rows.append(_option_row(ex.current, ex, "current (off the front)", moe=moe))
    yield (
        Table(
            f"explore: Pareto front of cost per 1M output tokens vs TPOT, stack {ex.stack} "
            f"(each at its largest concurrency meeting every SLO; peak {settings.capacity.peak_qps:g} req/s "
            f"x {settings.capacity.safety_factor:g})",
            (
                "",
                "instance",
                "TP/PP/EP" if moe else "TP",
                "max batch",
                "KV",
                "weights",
                "conc.",
                "TTFT ms",
                "TPOT ms",
                "tok/s",
                "$/1M out",
                "replicas",
                "nodes",
                "fleet $/h",
            ),
            rows,
            numeric=(2, 3, *range(6, 14)),
        )
    )
    estimated = sorted({o.candidate.instance_type for o in ex.front if "ESTIMATE" in _price_source(o)})
    if estimated:
        yield f"~ an estimated price ({', '.join(estimated)}): see frontier/capacity/gpus.py"
    if ex.current is None:
        yield f"current choice: dropped: {ex.current_dropped}"
    cheap, cur = ex.cheapest, ex.current
    if cur is not None and cheap is not cur:
        yield (
            f"cheapest meeting every SLO: {cheap.candidate.label} at {_per_million(cheap.cost_per_million)} per 1M "
            f"output tokens vs {_per_million(cur.cost_per_million)} for the current choice "
            f"({cheap.cost_per_million / cur.cost_per_million - 1:+.0%}); fleet for the peak "
            f"{money(cheap.plan.cost_per_hour)}/h vs {money(cur.plan.cost_per_hour)}/h"
        )
    fleet = min(ex.options, key=lambda o: (o.plan.cost_per_hour, o.cost_per_million))
    yield (
        f"cheapest fleet for the peak: {fleet.candidate.label}, {fleet.plan.nodes} nodes at "
        f"{money(fleet.plan.cost_per_hour)}/h ({_per_million(fleet.cost_per_million)} per 1M output tokens "
        "at full load; whole nodes and the rolling-upgrade spare round the fleet up)"
    )
    yield f"chart: {pareto_png(ex, settings.slo, chart)}"
    yield from disaggregation_report(pool, choose(settings, pool, model, ex))
    run = None
    if quality_workdir is not None:
        kv_dtypes = tuple(sorted({o.candidate.kv_cache_dtype for o in ex.options}))
        variants = variants_to_measure(pool, kv_dtypes)
        run = measure(settings, pool, variants, quality_workdir, on_progress=on_progress)
    points = quality_points(ex, run)
    yield quality_table(settings, pool, points, run, ex)
    quality_out = chart.with_name(chart.stem.removesuffix("-pareto") + "-quality.png")
    yield f"chart: {quality_png(ex, points, run, settings.slo, quality_out)}"
    if moe:
        sweep = expert_parallel_sweep(settings, pool, model, rules=rules)
        yield from expert_parallel_report(settings, pool, sweep)
        ep_out = chart.with_name(chart.stem.removesuffix("-pareto") + "-expert-parallel.png")
        yield f"chart: {expert_parallel_png(sweep, settings, pool, ep_out)}"


def _layout_row(x: Layout, picked: Layout) -> tuple[object, ...]:
    c = x.candidate
    return (
        "picked" if x is picked else "",
        x.kind,
        c.instance_type,
        c.tensor_parallel,
        c.max_batch_size,
        f"{x.ttft_s * 1e3:,.0f}",
        f"{x.itl.plain_s * 1e3:,.1f}",
        f"{x.itl.p99_s * 1e3:,.1f}",
        f"{x.transfer_s * 1e3:,.1f}" if x.kind == "P/D" else "-",
        f"{x.output_tokens_per_s:,.0f}",
        _per_million(x.cost_per_million),
        f"{x.prefill_replicas}+{x.replicas}" if x.kind == "P/D" else x.replicas,
        money(x.fleet_cost_per_hour),
        "ok" if x.passes else "breaks " + ", ".join(b.split(" (")[0] for b in x.broken),
    )


def disaggregation_report(pool: PoolSettings, choice: Choice) -> Iterator[Report]:
    """Colocated and prefill/decode layouts for ``pool``'s prompt and output lengths, and the pick."""
    yield Table(
        f"explore: colocated vs prefill/decode (P/D) for pool {pool.name}, {choice.prompt:,} prompt + "
        f"{choice.output:,} output tokens (per instance type its cheapest of each; ITL p99 under prefill "
        "interference held to slo.tpot_ms; modelled)",
        (
            "",
            "layout",
            "instance",
            "TP",
            "max batch",
            "TTFT ms",
            "ITL ms",
            "ITL p99 ms",
            "transfer ms",
            "tok/s",
            "$/1M out",
            "replicas (P+D)",
            "fleet $/h",
            "SLO",
        ),
        [_layout_row(x, choice.picked) for x in choice.layouts],
        numeric=(3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
    )
    for why, n in choice.not_split:
        yield f"not split into P/D: {n} option(s): {why}"
    split = [x for x in choice.layouts if x.rate is not None]
    unmeasured = sum(1 for x in split if x.rate is not None and not x.rate.measured)
    if unmeasured:
        yield (
            f"transfer: {unmeasured} of {len(split)} P/D row(s) over the instance's network figure, unmeasured "
            "here (frontier/capacity/gpus.py); the others over TCP as bench/kv_transfer_rate.py measured it"
        )
    yield f"layout: {choice.reason}"
    snippet = choice.disaggregation_yaml(pool.group.name)
    if snippet:
        picked = choice.picked.candidate
        yield (
            f"as the pool's setting (node group {pool.group.name}-prefill: {picked.instance_type}, "
            f"like the decode group):\n{snippet}"
        )


def quality_table(
    settings: Settings,
    pool: PoolSettings,
    points: tuple[QualityPoint, ...],
    run: QualityRun | None,
    ex: Exploration,
) -> Table:
    rows = []
    for p in points:
        o, q = p.option, p.quality
        if q is None:
            rate = "not measured (--quality)"
        elif q.pass_rate is None:
            rate = f"not measured: {q.not_measured}"
        else:
            rate = f"{q.pass_rate:.3f} ({q.passed}/{q.cases})"
        rows.append(
            (
                "*" if p.on_front else "",
                p.variant.quantization,
                _SHORT_DTYPES.get(p.variant.kv_cache_dtype, p.variant.kv_cache_dtype),
                "-" if o is None else o.candidate.label,
                "-" if o is None else f"{o.tpot_ms:,.1f}",
                why_no_option(ex, p.variant.quantization) if o is None else _per_million(o.cost_per_million),
                rate,
                "" if q is None or not q.failed else ", ".join(q.failed),
            )
        )
    where = (
        f"measured on {run.weights} weights of {pool.model.name}'s architecture scaled to "
        f"{run.shape['num_layers']} layers x {run.shape['hidden_size']} hidden, set {run.verify_set}"
        if run
        else "pass rates not measured: fab plan --explore --quality measures them"
    )
    return Table(
        f"explore: price vs pass rate by weights and KV cache dtype, stack {settings.stack} ({where}; "
        "* = on the front: no other variant both cheaper and passing more)",
        ("", "weights", "KV", "cheapest option", "TPOT ms", "$/1M out", "pass rate", "failed cases"),
        rows,
        numeric=(4, 5),
    )


def expert_parallel_report(
    settings: Settings, pool: PoolSettings, sweep: tuple[ExpertParallelRow, ...]
) -> Iterator[Report]:
    rt, group = pool.runtime, pool.group
    rows = []
    for r in sweep:
        p = r.point
        rows.append(
            (
                r.expert_parallel,
                r.gpus,
                r.where,
                r.max_batch_size,
                f"{r.weights_gb_per_gpu:,.1f}",
                "-" if p is None else p.concurrency,
                "-" if p is None else f"{p.tpot_s * 1e3:,.1f}",
                "-" if p is None else f"{r.alltoall_ms:,.2f}",
                "-" if p is None else f"{p.output_tokens_per_s:,.0f}",
                "-" if r.cost_per_million is None else _per_million(r.cost_per_million),
                r.why_not or ("ok" if r.rules == "ok" else "refused"),
            )
        )
    yield (
        Table(
            f"explore: expert parallel inside vs across the NVLink domain ({group.nvlink_domain_gpus} GPUs of "
            f"{group.instance_type}), stack {settings.stack}: TP {rt.tensor_parallel_size}, PP "
            f"{rt.pipeline_parallel_size}, max_batch_size {rt.batch.max_batch_size} per attention group, "
            "each at its largest concurrency meeting every SLO",
            (
                "EP",
                "GPUs",
                "all-to-all over",
                "max batch",
                "weights GB/GPU",
                "conc.",
                "TPOT ms",
                "all-to-all ms/step",
                "tok/s",
                "$/1M out",
                "stack rules",
            ),
            rows,
            numeric=(0, 1, 3, 4, 5, 6, 7, 8, 9),
        )
    )
    for rule in dict.fromkeys(r.rules for r in sweep if r.rules != "ok"):
        yield f"refused (modelled anyway, to show the cost): {rule}"
