"""`fab render` and `fab plan`: what a stack's settings turn into, before anything is deployed;
`fab baseline.diff`: two releases' measured capacity side by side."""

from __future__ import annotations

import hashlib
from pathlib import Path

from frontier_hostside.names import PLACEHOLDER_DIGEST, UNIT_NAME
from invoke import Collection, task
from invoke.exceptions import Exit

from frontier import project
from frontier.capacity.baseline import (
    DEFAULT_REGRESSION_THRESHOLD,
    diff_baselines,
    load_archived,
    load_baseline,
)
from frontier.capacity.chart import expert_parallel_png, pareto_png, quality_png
from frontier.capacity.explore import (
    MAX_BATCH_SIZES,
    TENSOR_PARALLEL,
    ExpertParallelRow,
    Exploration,
    Option,
    expert_parallel_sweep,
    explore,
    parallel_layouts,
)
from frontier.capacity.gpus import INSTANCES
from frontier.capacity.plan import GroupPlan, Plan, plan_stack, plan_with
from frontier.capacity.quality import (
    WEIGHTS,
    QualityPoint,
    QualityRun,
    measure,
    quality_points,
    variants_to_measure,
)
from frontier.capacity.replica import ReplicaModel, model_stack
from frontier.capacity.roofline import NotModelled, OperatingPoint, slo_violations
from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.release.artifact import is_placeholder
from frontier.render.host import image_reference
from frontier.render.stack import render_stack, write_files
from frontier.targets import backend_for, stack_problems


@task(
    help={
        "stack": "stack to render (default: $FRONTIER_STACK, else local)",
        "out": "folder to write into (default: rendered/<stack>/)",
        "digest": "runtime image digest, sha256:<64 hex>, for the systemd unit (default: a marked placeholder)",
    }
)
@reports_errors
def render(c, stack=None, out=None, digest=None):
    """Render every file of a stack from templates/ into a folder and list what was written.

    The systemd unit names the runtime image by digest. Without --digest it names an all-zero
    placeholder, marked in the unit and in a warning: the other files are complete, the unit is
    not deployable. Releases (`fab deploy`) always render with the digest being deployed.
    """
    settings = settings_for(stack)
    if digest is None:
        digest = PLACEHOLDER_DIGEST
    files = render_stack(settings, digest)
    files = dict(sorted({**files, **backend_for(settings).rendered_files(digest)}.items()))
    out_dir = Path(out) if out else project.root() / "rendered" / settings.stack
    write_files(files, out_dir)

    console = tables.console()
    rows = [
        (rel, f"{len(text.encode()):,}", hashlib.sha256(text.encode()).hexdigest()[:12])
        for rel, text in files.items()
    ]
    console.print(
        tables.table(
            f"rendered stack {settings.stack} into {out_dir}", ("file", "bytes", "sha256"), rows, numeric=(1,)
        )
    )
    stale = sorted(
        str(path.relative_to(out_dir))
        for path in out_dir.rglob("*")
        if path.is_file() and str(path.relative_to(out_dir)) not in files
    )
    if stale:
        console.print(
            f"note: {len(stale)} file(s) in {out_dir} were not written by this render: {', '.join(stale)}"
        )
    if is_placeholder(digest):
        console.print(
            f"warning: no --digest given: {UNIT_NAME} names the placeholder digest "
            f"{digest[:15]}… and is NOT deployable; pass --digest sha256:<64 hex> for a real release"
        )
    else:
        console.print(f"image: {image_reference(settings, digest)}")


@task(
    help={
        "stack": "stack to plan (default: $FRONTIER_STACK, else local)",
        "explore": "sweep instance type x tensor parallel x max_batch_size (x pipeline x expert parallel for a MoE "
        "model); print the price-latency Pareto front",
        "png": "where --explore writes its chart (default: .frontier/plan/<stack>-pareto.png)",
        "refresh-cpu": "CPU stacks: run the CPU micro-benchmark again instead of using its cached result",
        "quality": "with --explore: measure the verification set's pass rate of each weights x KV cache variant "
        "on this machine's engine (a scaled model of the stack's architecture; a minute or two)",
    }
)
@reports_errors
def plan(c, stack=None, explore=False, png=None, refresh_cpu=False, quality=False):
    """GPU memory fit, replicas, nodes and cost per node group of a stack, and its replica's roofline.

    The first tables size the fleet from the measured baseline (else the stated assumption); the
    roofline then models one replica from the GPU's datasheet (or the CPU's micro-benchmark),
    calibrated to the baseline where one exists, and sizes the fleet from that. --explore sweeps
    the serving settings and prints the Pareto front of cost per 1M output tokens vs TPOT.
    """
    settings = settings_for(stack)
    baseline = load_baseline(settings.stack)
    result = plan_stack(settings, baseline)
    console = tables.console()
    model, rt = settings.model, settings.runtime
    console.print(
        f"stack {settings.stack}: {model.name} ({tables.count(model.num_parameters)} parameters, {model.dtype}), "
        f"TP {rt.tensor_parallel_size} x PP {rt.pipeline_parallel_size} x EP {rt.expert_parallel_size}, "
        f"max_batch_size {rt.batch.max_batch_size} x max_seq_len {model.max_seq_len}"
    )
    console.print(f"per-replica throughput: {result.throughput.explanation}")
    for group_plan in result.groups:
        console.print(_memory_table(group_plan))
        console.print(_capacity_table(result, group_plan, settings))
        for warning in group_plan.warnings:
            console.print(f"warning: {warning}")
    try:
        model = model_stack(settings, baseline, refresh_cpu=refresh_cpu)
    except NotModelled as exc:
        if explore:
            raise
        console.print(f"roofline: not modelled: {exc}")
        return
    _print_roofline(console, settings, model)
    if explore:
        _print_exploration(console, settings, model, png, quality)


def _memory_table(p: GroupPlan):
    m, g = p.memory, p.group
    device = "GPU" if g.accelerator == "gpu" else "device (CPU)"
    rows = [
        (f"{device} memory", tables.size(m.gpu_memory_bytes), f"one {g.gpu_type}"),
        (
            "budget",
            tables.size(m.budget_bytes),
            f"runtime.gpu_memory_utilization {m.utilization} x GPU memory",
        ),
        ("weights (whole model)", tables.size(m.weights_bytes), "parameters x bytes per parameter"),
        ("weights per GPU", tables.size(m.weights_per_gpu_bytes), f"/ {p.gpus_per_replica} GPUs (TP x PP)"),
        (
            "KV bytes per token (model)",
            f"{m.kv_bytes_per_token:,} B",
            "2 x layers x kv_heads x head_dim x bytes",
        ),
        ("KV bytes per token per GPU", f"{m.kv_bytes_per_token_per_gpu:,} B", "KV heads / TP, layers / PP"),
        (
            "KV needed",
            tables.size(m.kv_required_bytes),
            f"{m.kv_tokens_required:,} tokens = max_batch_size x max_seq_len",
        ),
        (
            "reserved",
            tables.size(m.reserved_bytes),
            "runtime.reserved_memory_gb: activations, graphs, workspace",
        ),
        ("headroom", tables.size(m.headroom_bytes), "budget - weights - KV needed - reserved"),
        (
            "KV capacity",
            f"{m.kv_capacity_tokens:,} tokens",
            "(budget - weights - reserved) / KV bytes per token per GPU",
        ),
    ]
    return tables.table(
        f"node group {g.name}: memory of one {device}", ("item", "value", "how"), rows, numeric=(1,)
    )


def _capacity_table(result: Plan, p: GroupPlan, settings, title_suffix: str = ""):
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
        ("cost per hour", tables.money(p.cost_per_hour), f"nodes x ${g.price_per_hour:g}/h"),
        ("output tokens/s per replica", f"{t.output_tokens_per_s:,.0f}", source),
        (
            "cost per 1M output tokens",
            tables.money(p.cost_per_million_output_tokens),
            f"one replica at full load (${p.replica_cost_per_hour:,.2f}/h)",
        ),
        (
            "cost per 1M output tokens at peak",
            tables.money(p.fleet_cost_per_million_output_tokens),
            f"whole fleet at peak_qps x avg_output_tokens ({cap.avg_output_tokens})",
        ),
    ]
    return tables.table(
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


def _point_row(p: OperatingPoint, settings, mark: str = "") -> tuple:
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


def _print_roofline(console, settings, model: ReplicaModel) -> None:
    d, e, r = model.device, model.efficiency, model.replica
    console.print(
        f"roofline of one replica: {r.gpus} x {d.name}, {tables.size(d.bandwidth)}/s, "
        f"{d.flops / 1e12:,.3g} TFLOP/s, link {tables.size(d.link_bandwidth)}/s ({d.source})"
    )
    console.print(
        f"efficiencies: bandwidth {e.bandwidth:g}, FLOPs {e.flops:g}, link {e.link:g}, all-reduce latency "
        f"{e.allreduce_latency_s * 1e6:g} us, overhead {e.step_overhead_s * 1e3:.3g} ms/step + "
        f"{e.layer_overhead_s * 1e3:.3g} ms/layer + {e.seq_overhead_s * 1e3:.3g} ms/sequence ({e.source})"
    )
    best = model.fit.best
    if best is not None and (r.shape.experts or r.pipeline_parallel > 1):
        st = best.mean_step
        console.print(
            f"roofline: at the best point a step of {st.tokens:,.1f} tokens in {st.microbatches} micro-batch(es): "
            f"all-to-all {st.alltoall_s * 1e3:,.2f} ms, pipeline bubble {st.bubble_s * 1e3:,.2f} ms, of "
            f"{st.total_s * 1e3:,.2f} ms"
        )
    rows = [
        _point_row(p, settings, " (best)" if best is not None and p.concurrency == best.concurrency else "")
        for p in (model.fit.curve[c - 1] for c in _concurrency_grid(model))
    ]
    console.print(
        tables.table(
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
    console.print(
        tables.table("roofline: which figures are modelled and which measured", ("figure", "source"), figures)
    )
    throughput = model.throughput()
    if throughput is None:
        console.print(
            "roofline: no concurrency meets the SLOs; even one request at a time breaks "
            + ", ".join(model.fit.broken_at_1)
        )
        return
    console.print(f"per-replica throughput from the roofline: {throughput.explanation}")
    modelled = plan_with(settings, throughput)
    console.print(_capacity_table(modelled, modelled.groups[0], settings, " (from the roofline)"))


def _per_million(value: float) -> str:
    """Dollars per 1M tokens: cents, or three significant figures below ten cents (tiny models)."""
    return tables.money(value) if value >= 0.1 else f"${value:.3g}"


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


def _option_row(o: Option, ex: Exploration, mark: str | None = None, moe: bool = False) -> tuple:
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
        ("~" if estimate else "") + tables.money(g.cost_per_hour),
    )


def _print_exploration(console, settings, model: ReplicaModel, png, quality: bool = False) -> None:
    ex = explore(settings, model, rules=stack_problems, quantizations=WEIGHTS)
    moe = bool(settings.model.num_experts)
    layouts = (
        " x (pipeline, expert) parallel "
        + ", ".join(f"{pp}/{ep}" for pp, ep in parallel_layouts(settings, 8))
        + " (EP <= TP)"
        if moe
        else ""
    )
    console.print(
        f"explore: {ex.considered} candidates = instance types x tensor_parallel_size "
        f"{sorted({*TENSOR_PARALLEL, settings.runtime.tensor_parallel_size})}{layouts} x max_batch_size "
        f"{sorted({*MAX_BATCH_SIZES, settings.runtime.batch.max_batch_size})} x kv_cache_dtype x model.quantization "
        f"{'/'.join(WEIGHTS)}; "
        f"{len(ex.options)} fit and meet every "
        f"SLO; {ex.kv_note}"
    )
    console.print(
        tables.table(
            "explore: candidates dropped, by the first rule they break",
            ("reason", "candidates"),
            ex.dropped,
            numeric=(1,),
        )
    )
    rows = [_option_row(o, ex, moe=moe) for o in ex.front]
    if ex.current is not None and ex.current not in ex.front:
        rows.append(_option_row(ex.current, ex, "current (off the front)", moe=moe))
    console.print(
        tables.table(
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
        console.print(f"~ an estimated price ({', '.join(estimated)}): see frontier/capacity/gpus.py")
    if ex.current is None:
        console.print(f"current choice: dropped: {ex.current_dropped}")
    cheap, cur = ex.cheapest, ex.current
    if cur is not None and cheap is not cur:
        console.print(
            f"cheapest meeting every SLO: {cheap.candidate.label} at {_per_million(cheap.cost_per_million)} per 1M "
            f"output tokens vs {_per_million(cur.cost_per_million)} for the current choice "
            f"({cheap.cost_per_million / cur.cost_per_million - 1:+.0%}); fleet for the peak "
            f"{tables.money(cheap.plan.cost_per_hour)}/h vs {tables.money(cur.plan.cost_per_hour)}/h"
        )
    fleet = min(ex.options, key=lambda o: (o.plan.cost_per_hour, o.cost_per_million))
    console.print(
        f"cheapest fleet for the peak: {fleet.candidate.label}, {fleet.plan.nodes} nodes at "
        f"{tables.money(fleet.plan.cost_per_hour)}/h ({_per_million(fleet.cost_per_million)} per 1M output tokens "
        "at full load; whole nodes and the rolling-upgrade spare round the fleet up)"
    )
    out = Path(png) if png else project.state_dir() / "plan" / f"{settings.stack}-pareto.png"
    console.print(f"chart: {pareto_png(ex, settings.slo, out)}")
    run = None
    if quality:
        kv_dtypes = tuple(sorted({o.candidate.kv_cache_dtype for o in ex.options}))
        workdir = project.state_dir() / "plan" / f"{settings.stack}-quality"
        run = measure(settings, variants_to_measure(settings, kv_dtypes), workdir, on_progress=console.print)
    points = quality_points(ex, run)
    _print_quality(console, settings, points, run)
    quality_out = out.with_name(out.stem.removesuffix("-pareto") + "-quality.png")
    console.print(f"chart: {quality_png(ex, points, run, settings.slo, quality_out)}")
    if moe:
        sweep = expert_parallel_sweep(settings, model, rules=stack_problems)
        _print_expert_parallel(console, settings, sweep)
        ep_out = out.with_name(out.stem.removesuffix("-pareto") + "-expert-parallel.png")
        console.print(f"chart: {expert_parallel_png(sweep, settings, ep_out)}")


def _print_quality(console, settings, points: tuple[QualityPoint, ...], run: QualityRun | None) -> None:
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
                "no option meets every SLO" if o is None else _per_million(o.cost_per_million),
                rate,
                "" if q is None or not q.failed else ", ".join(q.failed),
            )
        )
    where = (
        f"measured on {run.weights} weights of {settings.model.name}'s architecture scaled to "
        f"{run.shape['num_layers']} layers x {run.shape['hidden_size']} hidden, set {run.verify_set}"
        if run
        else "pass rates not measured: fab plan --explore --quality measures them"
    )
    console.print(
        tables.table(
            f"explore: price vs pass rate by weights and KV cache dtype, stack {settings.stack} ({where}; "
            "* = on the front: no other variant both cheaper and passing more)",
            ("", "weights", "KV", "cheapest option", "TPOT ms", "$/1M out", "pass rate", "failed cases"),
            rows,
            numeric=(4, 5),
        )
    )


def _print_expert_parallel(console, settings, sweep: tuple[ExpertParallelRow, ...]) -> None:
    rt, group = settings.runtime, settings.serving_group
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
    console.print(
        tables.table(
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
        console.print(f"refused (modelled anyway, to show the cost): {rule}")


@task(
    name="diff",
    help={
        "stack": "stack name (default $FRONTIER_STACK, else local)",
        "threshold": f"flag a figure that moved the wrong way by more than this fraction (default {DEFAULT_REGRESSION_THRESHOLD})",
    },
)
@reports_errors
def baseline_diff(c, a, b, stack=None, threshold=DEFAULT_REGRESSION_THRESHOLD):
    """Compare the baselines archived for releases A and B figure by figure; exit 1 on a regression."""
    settings = settings_for(stack)
    before, after = load_archived(settings.stack, a), load_archived(settings.stack, b)
    diffs = diff_baselines(before, after, float(threshold))
    rows = [
        (f"{d.label} ({'higher' if d.higher_is_better else 'lower'} is better)", f"{d.before:,.1f}",
         f"{d.after:,.1f}", d.change, d.verdict)
        for d in diffs
    ]  # fmt: skip
    title = f"baseline {settings.stack}: A {a} ({before.measured_at}) -> B {b} ({after.measured_at})"
    columns = ("metric", f"A {a}", f"B {b}", "change", "verdict")
    tables.console().print(tables.table(title, columns, rows, numeric=(1, 2, 3)))
    regressions = [d.name for d in diffs if d.regression]
    if regressions:
        raise Exit(f"{len(regressions)} regression(s) from {a} to {b}: {', '.join(regressions)}", code=1)


def register(namespace: Collection) -> None:
    namespace.add_task(render)
    namespace.add_task(plan)
    namespace.add_collection(Collection("baseline", baseline_diff))
