"""Tasks of the embedded local stack and of load testing: ``local.up``, ``local.down``, ``loadtest``."""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from frontier import project
from frontier.cli.common import reports_errors, settings_for
from frontier.config.load import chosen_pool
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.loadtest.client import LoadTestError, Target
from frontier.loadtest.report import (
    LoadShape,
    knee_line,
    length_table,
    measure,
    plot,
    scaling_target,
    step_notes,
    steps_table,
    wide_console,
)
from frontier.loadtest.stats import Knee, SloTargets, StepSummary, concurrency_knee, find_knee
from frontier.targets import backend_for
from frontier.targets.local import cluster as local

STACK_HELP = "stack name (default $FRONTIER_STACK, else local)"


def _components_table(title: str, rows: list[local.Component]) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("component", "state", "detail"):
        table.add_column(name)
    colour = {"started": "green", "created": "green", "stopped": "yellow"}
    for row in rows:
        state = f"[{colour[row.state]}]{row.state}[/]" if row.state in colour else row.state
        table.add_row(row.name, state, row.detail)
    return table


@task(name="up", help={"stack": STACK_HELP})
@reports_errors
def local_up(c, stack=None):
    """Bring up the embedded local stack (moto, host slots over SSH, HAProxy); idempotent."""
    settings = settings_for(stack)
    rows = local.up(settings)
    console = Console()
    console.print(_components_table(f"local stack {settings.stack!r}", rows))
    already = all(r.state in ("running", "exists") for r in rows)
    console.print(
        ("everything was already running; " if already else "")
        + f"balancer {local.balancer_url(settings)}, connection: {local.connection_mode(settings)}"
    )


@task(name="down", help={"stack": STACK_HELP})
@reports_errors
def local_down(c, stack=None):
    """Stop every process of the embedded local stack (runtimes, HAProxy, sshd, moto)."""
    settings = settings_for(stack)
    Console().print(_components_table(f"local stack {settings.stack!r}", local.down(settings)))


@task(
    name="autoscale",
    help={
        "stack": STACK_HELP,
        "seconds": "stop after this many seconds (default: run until interrupted)",
    },
)
@reports_errors
def local_autoscale(c, stack=None, seconds=None):
    """Scale the local group on the runtimes' queue depth: launch spare slots, retire drained ones."""
    from frontier.targets.local.autoscaler import Autoscaler, Decision, Observation, Policy

    settings = settings_for(stack)
    pool = chosen_pool(settings)  # the local stack's one pool, its group the one that scales
    policy = Policy.of(settings, pool).timing  # refuses a stack that is not local, before anything runs
    group = pool.group
    fleet = backend_for(settings, pool).fleet()
    console = Console()
    size = fleet.size()
    console.print(
        f"{fleet.name}: {size.desired} in service (min {size.min_size}, max {size.max_size}); target "
        f"{group.target_queue_depth:g} waiting per host; out after "
        f"{policy.scale_out_after_s:g}s, in after {policy.scale_in_after_s:g}s"
    )
    fleet.say = lambda line: console.print(f"  {line}")
    last = [0.0]

    def observed(seen: Observation) -> None:
        if seen.at - last[0] >= 5:  # one line every few seconds, not per scrape
            last[0] = seen.at
            console.print(
                f"  [dim]{seen.hosts} host(s): {seen.waiting:.0f} waiting, {seen.running:.0f} running"
                + (f", {seen.unreachable} not answering" if seen.unreachable else "")
                + "[/]"
            )

    def decided(decision: Decision, outcome: str) -> None:
        console.print(
            f"[bold]scale {decision.direction}[/] {decision.current} -> {decision.desired}: {decision.reason}; {outcome}"
        )

    scaler = Autoscaler(settings, fleet, on_observation=observed, on_decision=decided)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the loop, not the report
        scaler.run(float(seconds) if seconds is not None else None)
    console.print(f"{fleet.name}: {fleet.size().desired} in service")


def slo_targets(settings: Settings) -> SloTargets:
    slo = settings.slo
    return SloTargets(
        ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms, p99_latency_ms=slo.p99_latency_ms, error_rate=slo.error_rate
    )


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise LoadTestError(f"--step {text!r}: expected comma-separated rates, e.g. 1,2,4,8") from None
    if not rates or any(r <= 0 for r in rates):
        raise LoadTestError(f"--step {text!r}: every rate must be > 0 requests per second")
    return rates


def default_target_url(settings: Settings) -> str:
    try:
        return backend_for(settings).endpoint()
    except FrontierError as exc:
        raise LoadTestError(
            f"stack {settings.stack!r}: give --url, the HTTPS address of the stack's load balancer "
            f"(for example the `endpoint` output of `pulumi stack output -s {settings.stack}`): {exc}"
        ) from None


def default_api_key(settings: Settings) -> str | None:
    if os.environ.get("FRONTIER_API_KEY"):
        return os.environ["FRONTIER_API_KEY"]
    try:
        return backend_for(settings).api_key()
    except FrontierError:
        return None


@task(
    name="loadtest",
    help={
        "stack": STACK_HELP,
        "url": "base URL of an OpenAI-compatible endpoint (default: the local stack's balancer)",
        "rate": "Poisson arrivals at this many requests/s (default: the stack's capacity.peak_qps)",
        "step": "a step load: comma-separated rates, each held --step-duration seconds; finds the knee",
        "concurrency": "closed loop with this many clients instead of arrivals at a rate; several, comma-separated and rising (1,2,4,8,16), sweep them --duration each and print the knee as the autoscaling target",
        "duration": "seconds of a single-rate or fixed-concurrency run (default 30)",
        "step_duration": "seconds per rate of a step load (default 20)",
        "burstiness": "gamma shape of the arrival gaps: 1 is Poisson, <1 burstier (default 1)",
        "prompt_tokens": "approximate prompt length, or comma-separated lengths to mix, each request drawing one; the report splits latency by input length (default capacity.avg_prompt_tokens)",
        "max_tokens": "tokens to generate per request (default capacity.avg_output_tokens)",
        "endpoint": "completions or chat (default completions)",
        "max_in_flight": "cap on requests in flight from this client (default none)",
        "replicas": "replicas behind --url, to turn the knee into per-replica capacity (default 1)",
        "save_baseline": "save the knee of a step load as the stack's capacity baseline (default on)",
        "out": "folder for the PNG plot (default .frontier/loadtest/<stack>)",
        "seed": "random seed of arrivals and prompts",
        "timeout": "seconds before one request counts as timed out (default 60)",
        "release": "release id the target runs, recorded in the baseline (default: the last good deploy)",
        "metrics": "comma-separated base URLs of the replicas whose /metrics give CPU and GPU use (default: --url)",
    },
)
@reports_errors
def loadtest(
    c,
    stack=None,
    url=None,
    rate=None,
    step=None,
    concurrency=None,
    duration=30.0,
    step_duration=20.0,
    burstiness=1.0,
    prompt_tokens=None,
    max_tokens=None,
    endpoint="completions",
    max_in_flight=None,
    replicas=1,
    save_baseline=True,
    out=None,
    seed=0,
    timeout=60.0,
    release=None,
    metrics=None,
):
    """Load an OpenAI-compatible endpoint with streaming clients; a step load finds the knee."""
    settings = settings_for(stack)
    if endpoint not in ("completions", "chat"):
        raise LoadTestError(f"--endpoint {endpoint!r}: must be 'completions' or 'chat'")
    if sum(x is not None for x in (rate, step, concurrency)) > 1:
        raise LoadTestError("give one of --rate, --step or --concurrency")
    if int(replicas) < 1:
        raise LoadTestError(f"--replicas {replicas}: must be >= 1")
    mix = _parse_lengths(prompt_tokens) if prompt_tokens is not None else ()
    target = Target(
        base_url=url or default_target_url(settings),
        model=chosen_pool(settings).name,
        api_key=default_api_key(settings),
        endpoint=endpoint,
        prompt_tokens=mix[0] if mix else settings.capacity.avg_prompt_tokens,
        prompt_mix=mix if len(mix) > 1 else (),
        max_tokens=int(max_tokens or settings.capacity.avg_output_tokens),
        timeout_s=float(timeout),
    )
    slo = slo_targets(settings)
    console = wide_console()
    console.print(
        f"load test of {target.url} (model {target.model}, "
        f"~{'/'.join(map(str, target.prompt_mix)) or target.prompt_tokens} prompt tokens, "
        f"{target.max_tokens} output tokens); SLO: TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms, "
        f"p99 {slo.p99_latency_ms:g} ms, errors {slo.error_rate:.1%}"
    )
    if step:
        shape = LoadShape(rates=tuple(_parse_rates(step)), seconds=float(step_duration))
    elif concurrency is not None:
        levels = _parse_levels(concurrency)
        shape = LoadShape(concurrency=levels[0], seconds=float(duration))
    else:
        shape = LoadShape(
            rates=(float(rate) if rate is not None else settings.capacity.peak_qps,), seconds=float(duration)
        )
    shape = replace(
        shape,
        burstiness=float(burstiness),
        max_in_flight=int(max_in_flight) if max_in_flight else None,
        seed=int(seed),
    )
    metrics_urls = tuple(u.strip() for u in str(metrics).split(",") if u.strip()) if metrics else ()
    shapes = [shape]
    if concurrency is not None:
        shapes = [replace(shape, concurrency=level) for level in levels]
    steps = [
        s
        for each in shapes
        for s in measure(
            target,
            each,
            slo,
            console,
            length_edges=settings.capacity.input_length_edges,
            metrics_urls=metrics_urls,
        )
    ]
    knee = find_knee(steps, slo) if step else None
    console.print(steps_table(steps, slo, knee))
    for note in step_notes(steps, slo):
        console.print(f"  {note}")
    for s in steps:
        if len(s.by_length) > 1:
            table = length_table(s.by_length)
            load = f"{s.offered_rps:g} req/s" if s.offered_rps is not None else f"concurrency {s.concurrency}"
            table.title = f"{table.title} at {load}"
            console.print(table)
    if len(shapes) > 1:
        _print_scaling_target(console, settings, steps, int(replicas))
        return
    if not step:
        _fail_on_errors(steps, slo)
        return
    console.print(knee_line(knee, steps))
    folder = Path(out) if out else project.state_dir() / "loadtest" / settings.stack
    png = plot(steps, slo, knee, folder / "latency-vs-load.png", f"{settings.stack}: {target.url}")
    console.print(f"plot: {png}")
    if knee is not None and save_baseline:
        path = save_knee_baseline(settings, knee, int(replicas), release or current_release(settings))
        console.print(
            f"capacity baseline saved: {path} ({knee.rate_rps / int(replicas):g} req/s per replica); `fab plan` now uses it"
        )
    if knee is None:
        raise Exit("no step held the SLO: no baseline saved", code=1)


def _comma_separated(value: object, option: str, most: int, *, give: str, each: str) -> tuple[int, ...]:
    """``option``'s ``value``: one whole number, or several comma-separated, each 1..``most``; the
    errors say what to ``give`` and what ``each`` number must be."""
    try:
        numbers = tuple(int(part) for part in str(value).split(","))
    except ValueError:
        raise LoadTestError(f"{option} {value}: give {give}") from None
    if any(not 1 <= n <= most for n in numbers):
        raise LoadTestError(f"{option} {value}: each {each}")
    return numbers


def _parse_lengths(value: object) -> tuple[int, ...]:
    """``--prompt-tokens``: one length, or several comma-separated, each 1..1,048,576 tokens."""
    return _comma_separated(
        value,
        "--prompt-tokens",
        1_048_576,
        give="a number of tokens, or several separated by commas",
        each="length must be 1..1048576 tokens",
    )


def _parse_levels(value: object) -> tuple[int, ...]:
    """``--concurrency``: one number of clients, or several rising, comma-separated, each 1..100,000."""
    levels = _comma_separated(
        value,
        "--concurrency",
        100_000,
        give="a number of clients, or several rising, separated by commas",
        each="level must be 1..100000 clients",
    )
    if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
        raise LoadTestError(f"--concurrency {value}: the levels of a sweep must rise strictly")
    return levels


def _print_scaling_target(
    console: Console, settings: Settings, steps: list[StepSummary], replicas: int
) -> None:
    """The sweep's knee as the chosen pool's scaling target, in the stack file's words; exit 1
    where the sweep has no knee (fewer than two levels completed requests)."""
    knee = concurrency_knee(steps)
    if knee is None:
        raise Exit("no knee: fewer than two concurrency levels completed requests", code=1)
    pool = chosen_pool(settings)
    target = scaling_target(knee, replicas, pool.group.name, pool.runtime.max_concurrency)
    for line in target.lines(knee):
        console.print(line, markup=False)


def _fail_on_errors(steps: list[StepSummary], slo: SloTargets) -> None:
    broken = [reason for s in steps for reason in s.verdict(slo)]
    if broken:
        raise Exit("SLO not met: " + "; ".join(broken), code=1)


def _figure(ms: float) -> float | None:
    """A latency for the baseline's JSON: rounded, None where nothing was measured (NaN)."""
    return None if math.isnan(ms) else round(ms, 1)


def save_knee_baseline(settings: Settings, knee: Knee, replicas: int, release_id: str) -> Path:
    """Record the knee as the stack's capacity baseline, per replica, for ``fab plan``."""
    from frontier.capacity.baseline import Baseline, LengthFigures, save_baseline

    step = knee.step
    cpu = getattr(step, "cpu_cores", None)
    gpus = getattr(step, "gpus", None)
    memory = getattr(step, "gpu_memory_bytes", None)
    util = getattr(step, "gpu_util_pct", None)
    baseline = Baseline(
        stack=settings.stack,
        measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        replica_qps=round(knee.rate_rps / replicas, 4),
        output_tokens_per_s=round(step.output_tokens_per_s / replicas, 2),
        p50_latency_ms=round(step.e2el.p50_ms, 1),
        p99_latency_ms=round(step.e2el.p99_ms, 1),
        ttft_p99_ms=round(step.ttft.p99_ms, 1),
        hosts_measured=replicas,
        release_id=release_id,
        p95_latency_ms=_figure(step.e2el.p95_ms),
        ttft_p50_ms=_figure(step.ttft.p50_ms),
        ttft_p95_ms=_figure(step.ttft.p95_ms),
        itl_p50_ms=_figure(step.itl.p50_ms),
        itl_p95_ms=_figure(step.itl.p95_ms),
        itl_p99_ms=_figure(step.itl.p99_ms),
        # Already per replica: the mean over the replicas whose /metrics were read.
        cpu_cores=None if cpu is None else round(cpu, 3),
        gpus=gpus,
        gpu_util_pct=None if util is None else round(util, 1),
        gpu_memory_bytes=None if memory is None else round(memory),
        by_length=tuple(
            LengthFigures(
                label=b.label,
                requests=b.requests,
                ttft_p95_ms=_figure(b.ttft.p95_ms),
                itl_p95_ms=_figure(b.itl.p95_ms),
                e2el_p95_ms=_figure(b.e2el.p95_ms),
            )
            for b in step.by_length
        ),
    )
    return save_baseline(baseline)


def current_release(settings: Settings) -> str:
    """The release the stack last rolled successfully (what the load test measured), or 'unknown'."""
    try:
        record = backend_for(settings).history_store().last_good()
    except Exception:  # an unreachable history only loses the label, never the measurement
        return "unknown"
    return str(record.get("release", "unknown")) if record else "unknown"


def register(namespace: Collection) -> None:
    namespace.add_collection(Collection("local", local_up, local_down, local_autoscale))
    namespace.add_task(loadtest)
