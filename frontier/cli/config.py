"""`fab render` and `fab plan`: what a stack's settings turn into, before anything is deployed."""

from __future__ import annotations

import hashlib
from pathlib import Path

from invoke import Collection, task

from frontier import project
from frontier.capacity.baseline import load_baseline
from frontier.capacity.plan import GroupPlan, Plan, plan_stack
from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.render import files as renderer


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
        digest = renderer.PLACEHOLDER_DIGEST
    files = renderer.render_stack(settings, digest)
    out_dir = Path(out) if out else project.root() / "rendered" / settings.stack
    renderer.write_files(files, out_dir)

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
    if renderer.is_placeholder(digest):
        console.print(
            f"warning: no --digest given: {renderer.UNIT_NAME} names the placeholder digest "
            f"{digest[:15]}… and is NOT deployable; pass --digest sha256:<64 hex> for a real release"
        )
    else:
        console.print(f"image: {renderer.image_reference(settings, digest)}")


@task(help={"stack": "stack to plan (default: $FRONTIER_STACK, else local)"})
@reports_errors
def plan(c, stack=None):
    """GPU memory fit, replicas, nodes and cost per node group of a stack."""
    settings = settings_for(stack)
    result = plan_stack(settings, load_baseline(settings.stack))
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


def _capacity_table(result: Plan, p: GroupPlan, settings):
    t, g, cap = result.throughput, p.group, settings.capacity
    source = "measured baseline" if t.source == "baseline" else "ASSUMPTION (capacity.assumed_replica_qps)"
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
        ("GPUs per replica", str(p.gpus_per_replica), "tensor x pipeline parallel"),
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
        f"node group {g.name}: replicas, nodes and cost", ("item", "value", "how"), rows, numeric=(1,)
    )


def register(namespace: Collection) -> None:
    namespace.add_task(render)
    namespace.add_task(plan)
