"""`fab render` and `fab plan`: what a stack's settings turn into, before anything is deployed;
`fab baseline.diff`: two releases' measured capacity side by side."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
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
from frontier.capacity.markets import market_report
from frontier.capacity.plan import plan_stack
from frontier.capacity.plan_tables import (
    Report,
    Table,
    exploration_report,
    fleet_report,
    roofline_report,
)
from frontier.capacity.replica import model_stack
from frontier.capacity.roofline import NotModelled
from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.config.load import chosen_pool
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
        for pool in settings.pools:
            named = "" if len(settings.pools) == 1 else f" (model {pool.name})"
            console.print(f"image: {image_reference(pool, digest)}{named}")


@task(
    help={
        "stack": "stack to plan (default: $FRONTIER_STACK, else local)",
        "model": "the model pool to plan (needed where the stack serves several)",
        "explore": "sweep instance type x tensor parallel x max_batch_size (x pipeline x expert parallel for a MoE "
        "model); print the price-latency Pareto front",
        "png": "where --explore writes its chart (default: .frontier/plan/<stack>-pareto.png)",
        "refresh-cpu": "CPU stacks: run the CPU micro-benchmark again instead of using its cached result",
        "quality": "with --explore: measure the verification set's pass rate of each weights x KV cache variant "
        "on this machine's engine (a scaled model of the stack's architecture; a minute or two)",
    }
)
@reports_errors
def plan(c, stack=None, explore=False, png=None, refresh_cpu=False, quality=False, model=None):
    """GPU memory fit, replicas, nodes and cost per node group of a stack, and its replica's roofline.

    The first tables size the fleet from the measured baseline (else the stated assumption); the
    roofline then models one replica from the GPU's datasheet (or the CPU's micro-benchmark),
    calibrated to the baseline where one exists, and sizes the fleet from that. --explore sweeps
    the serving settings and prints the Pareto front of cost per 1M output tokens vs TPOT.
    """
    settings = settings_for(stack)
    pool = chosen_pool(settings, model)
    baseline = load_baseline(settings.stack)
    console = tables.console()
    _show(console, fleet_report(settings, pool, plan_stack(settings, pool, baseline)))
    try:
        replica = model_stack(settings, pool, baseline, refresh_cpu=refresh_cpu)
    except NotModelled as exc:
        if explore:
            raise
        console.print(f"roofline: not modelled: {exc}")
        return
    _show(console, roofline_report(settings, pool, replica))
    if explore:
        plans = project.state_dir() / "plan"
        chart = Path(png) if png else plans / f"{settings.stack}-pareto.png"
        workdir = plans / f"{settings.stack}-quality" if quality else None
        _show(
            console,
            exploration_report(settings, pool, replica, stack_problems, chart, workdir, console.print),
        )
        # The same fleet bought on-demand, as spot and in a Capacity Block, where the stack prices them.
        _show(console, market_report(settings, plan_stack(settings, pool, baseline)))


def _show(console, report: Iterable[Report]) -> None:
    for item in report:
        if isinstance(item, Table):
            console.print(tables.table(item.title, item.columns, item.rows, numeric=item.numeric))
        else:
            console.print(item)


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
        (f"{d.label} ({'higher' if d.higher_is_better else 'lower'} is better)",
         d.before_note if d.before is None else f"{d.before:,.1f}",
         d.after_note if d.after is None else f"{d.after:,.1f}", d.change, d.verdict)
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
