"""Running a load test for a person: live progress, the closing table, and the latency-vs-load plot."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import httpx
from frontier_hostside.names import (
    GPU_MEMORY_USED_METRIC,
    GPU_UTILIZATION_METRIC,
    GPUS_METRIC,
    PREFIX_CACHE_HITS_METRIC,
    PREFIX_CACHE_QUERIES_METRIC,
    PROCESS_CPU_METRIC,
)
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from frontier.loadtest.client import Target, run_concurrency, run_steps
from frontier.loadtest.stats import (
    ConcurrencyKnee,
    Distribution,
    Knee,
    LengthBucket,
    RequestSample,
    SloTargets,
    StepSummary,
    summarize,
)


def wide_console() -> Console:
    """A console for tables: the terminal's width, or 200 columns when the output is a file or pipe (the load table is that wide)."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=200)


@dataclass(frozen=True)
class LoadShape:
    """What to send: Poisson ``rates`` (one rate, or a step load held ``seconds`` each) or a closed
    loop of ``concurrency`` clients for ``seconds``."""

    rates: tuple[float, ...] = ()
    concurrency: int | None = None
    seconds: float = 30.0
    burstiness: float = 1.0
    max_in_flight: int | None = None
    seed: int = 0

    @property
    def total_s(self) -> float:
        return self.seconds * max(1, len(self.rates))

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"{self.concurrency} clients"
        return "step load" if len(self.rates) > 1 else f"{self.rates[0]:g} req/s"


@dataclass(frozen=True)
class ServedStep(StepSummary):
    """A step with what the replicas' /metrics said about it (each None where /metrics could not be
    read, e.g. behind a balancer that hides it):

    * ``prefix_cache_hit_rate`` — the share of prompt tokens found in the prefix cache;
    * ``cpu_cores`` — a replica's runtime process's CPU seconds over the step's wall seconds, the
      mean over the replicas read (1.0 = one core busy throughout);
    * ``gpus`` — the GPUs a replica sees, 0 on CPU hosts; ``gpu_util_pct`` their mean utilisation
      over the step's readings and ``gpu_memory_bytes`` the most memory a replica had in use at one
      reading, both None where there is no GPU or its runtime exports no such series.
    """

    prefix_cache_hit_rate: float | None = None
    cpu_cores: float | None = None
    gpus: int | None = None
    gpu_util_pct: float | None = None
    gpu_memory_bytes: float | None = None


@dataclass(frozen=True)
class Scrape:
    """The figures a load test reads off the replicas' /metrics at one moment: the prefix cache's
    counters summed over the replicas, the resource figures per replica (their mean)."""

    at: float  # the client's perf_counter when the last /metrics answered
    prefix_queries: float | None
    prefix_hits: float | None
    cpu_seconds: float | None
    gpus: int | None
    gpu_util_pct: float | None  # mean over every GPU of every replica
    gpu_memory_bytes: float | None


_SCRAPED = (
    PREFIX_CACHE_QUERIES_METRIC,
    PREFIX_CACHE_HITS_METRIC,
    PROCESS_CPU_METRIC,
    GPUS_METRIC,
    GPU_UTILIZATION_METRIC,
    GPU_MEMORY_USED_METRIC,
)


def _families(text: str) -> dict[str, list[float]]:
    """The samples of the families a load test reads, by family name (``_total`` dropped)."""
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
        if name in _SCRAPED:
            found.setdefault(name, []).append(float(line.rsplit(" ", 1)[1]))
    return found


def scrape(target: Target, metrics_urls: Sequence[str] = ()) -> Scrape | None:
    """One reading of every replica's /metrics (``metrics_urls``, default the target's own address);
    None when one cannot be read, as sums over some of them would mislead."""
    readings = []
    for base in metrics_urls or (target.base_url,):
        try:
            resp = httpx.get(base.rstrip("/") + "/metrics", headers=target.headers(), timeout=5)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        readings.append(_families(resp.text))
    at = time.perf_counter()

    def total(name: str) -> float | None:
        if not all(name in r for r in readings):
            return None
        return sum(sum(r[name]) for r in readings)

    def per_replica(name: str) -> float | None:
        summed = total(name)
        return None if summed is None else summed / len(readings)

    utils = [u for r in readings for u in r.get(GPU_UTILIZATION_METRIC, [])]
    gpus = per_replica(GPUS_METRIC)
    return Scrape(
        at=at,
        prefix_queries=total(PREFIX_CACHE_QUERIES_METRIC),
        prefix_hits=total(PREFIX_CACHE_HITS_METRIC),
        cpu_seconds=per_replica(PROCESS_CPU_METRIC),
        gpus=None if gpus is None else round(gpus),
        gpu_util_pct=sum(utils) / len(utils) if utils else None,
        gpu_memory_bytes=per_replica(GPU_MEMORY_USED_METRIC),
    )


def prefix_cache_counters(target: Target) -> tuple[float, float] | None:
    """(prompt tokens looked up, found) in the prefix cache, summed over /metrics; None if unreadable."""
    reading = scrape(target)
    if reading is None or reading.prefix_queries is None or reading.prefix_hits is None:
        return None
    return reading.prefix_queries, reading.prefix_hits


@dataclass(frozen=True)
class StepUse:
    """What the replicas' /metrics said about one step (see :class:`ServedStep`)."""

    prefix_cache_hit_rate: float | None = None
    cpu_cores: float | None = None
    gpus: int | None = None
    gpu_util_pct: float | None = None
    gpu_memory_bytes: float | None = None


class _Scrapes:
    """/metrics read at each step's start and at the end (counters: step i's change is between
    readings i and i + 1), and every ``every_s`` in between (gauges: GPU utilisation and memory are
    averaged and maxed over the step's readings). Reads run on threads, so the load's event loop
    never waits."""

    def __init__(self, target: Target, metrics_urls: Sequence[str] = (), every_s: float = 1.0) -> None:
        self.target = target
        self.metrics_urls = tuple(metrics_urls)
        self.every_s = every_s
        self.threads: dict[int, threading.Thread] = {}
        self.boundaries: dict[int, Scrape | None] = {}
        self.readings: list[tuple[int, Scrape]] = []
        self.current = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def take(self, index: int) -> None:
        self.current = index

        def read() -> None:
            self.boundaries[index] = scrape(self.target, self.metrics_urls)

        self.threads[index] = thread = threading.Thread(target=read, daemon=True)
        thread.start()
        if index == 0:
            self._poller.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.every_s):
            step = self.current
            reading = scrape(self.target, self.metrics_urls)
            if reading is not None:
                self.readings.append((step, reading))

    def uses(self, steps: int) -> list[StepUse]:
        self._stop.set()
        for thread in self.threads.values():
            thread.join(10)
        if self._poller.ident is not None:
            self._poller.join(10)
        return [self._use(i) for i in range(steps)]

    def _use(self, i: int) -> StepUse:
        before, after = self.boundaries.get(i), self.boundaries.get(i + 1)
        gauges = [r for r in (before, after) if r is not None] + [r for s, r in self.readings if s == i]
        gpus = next((r.gpus for r in gauges if r.gpus is not None), None)
        utils = [r.gpu_util_pct for r in gauges if r.gpu_util_pct is not None]
        memory = [r.gpu_memory_bytes for r in gauges if r.gpu_memory_bytes is not None]
        return StepUse(
            prefix_cache_hit_rate=_rate(before, after),
            cpu_cores=_cpu_cores(before, after),
            gpus=gpus,
            gpu_util_pct=sum(utils) / len(utils) if gpus and utils else None,
            gpu_memory_bytes=max(memory) if gpus and memory else None,
        )


def _rate(before: Scrape | None, after: Scrape | None) -> float | None:
    if before is None or after is None or before.prefix_queries is None or after.prefix_queries is None:
        return None
    if (
        before.prefix_hits is None
        or after.prefix_hits is None
        or after.prefix_queries <= before.prefix_queries
    ):
        return None
    return (after.prefix_hits - before.prefix_hits) / (after.prefix_queries - before.prefix_queries)


def _cpu_cores(before: Scrape | None, after: Scrape | None) -> float | None:
    """CPU seconds per wall second between two readings; None across a restart (the counter fell)."""
    if before is None or after is None or before.cpu_seconds is None or after.cpu_seconds is None:
        return None
    wall = after.at - before.at
    if wall <= 0 or after.cpu_seconds < before.cpu_seconds:
        return None
    return (after.cpu_seconds - before.cpu_seconds) / wall


def _served(steps: list[StepSummary], uses: list[StepUse]) -> list[StepSummary]:
    return [
        ServedStep(
            **{f.name: getattr(s, f.name) for f in fields(StepSummary)},
            **{f.name: getattr(u, f.name) for f in fields(StepUse)},
        )
        for s, u in zip(steps, uses, strict=True)
    ]


def measure(
    target: Target,
    shape: LoadShape,
    slo: SloTargets,
    console: Console,
    *,
    length_edges: Sequence[int] = (),
    metrics_urls: Sequence[str] = (),
) -> list[StepSummary]:
    """Run the load with a live progress bar; one summary per step (one for a single rate or loop),
    its requests split by prompt length at ``length_edges``, its resource use read off the
    ``metrics_urls`` (default: the target's own /metrics)."""
    snapshots = _Scrapes(target, metrics_urls)
    snapshots.take(0)
    with LiveProgress(console, shape.total_s, shape.label) as progress:
        if shape.concurrency is not None:
            result = asyncio.run(
                run_concurrency(
                    target, shape.concurrency, shape.seconds, seed=shape.seed, on_event=progress.on_event
                )
            )
            snapshots.take(1)
            step = summarize(
                result.samples,
                window=result.window,
                slo=slo,
                concurrency=shape.concurrency,
                length_edges=length_edges,
            )
            return _served([step], snapshots.uses(1))

        def on_step(index: int, rate: float) -> None:
            if index:
                snapshots.take(index)
            progress.on_step(index, rate)

        results = asyncio.run(
            run_steps(
                target,
                shape.rates,
                shape.seconds,
                burstiness=shape.burstiness,
                seed=shape.seed,
                max_in_flight=shape.max_in_flight,
                on_event=progress.on_event,
                on_step=on_step,
            )
        )
    snapshots.take(len(results))
    everything = [s for r in results for s in r.samples]
    steps = [
        summarize(
            r.samples,
            window=r.window,
            slo=slo,
            offered_rps=r.rate_rps,
            completions=everything,
            length_edges=length_edges,
        )
        for r in results
    ]
    return _served(steps, snapshots.uses(len(steps)))


class LiveProgress:
    """A rich progress bar over a load's total duration with running counts of requests."""

    def __init__(self, console: Console, total_s: float, label: str = "load") -> None:
        self.console = console
        self.total_s = total_s
        self.label = label
        self._lock = threading.Lock()
        self.sent = self.ok = self.failed = 0
        self.step_label = ""
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[counts]}"),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(label, total=total_s, counts="")
        self._started = 0.0

    def __enter__(self) -> LiveProgress:
        self._started = time.perf_counter()
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._refresh(final=True)
        self._progress.stop()

    def on_step(self, index: int, rate: float) -> None:
        self.step_label = f"step {index + 1} @ {rate:g} req/s"
        self._refresh()

    def on_event(self, kind: str, sample: RequestSample | None) -> None:
        with self._lock:
            if kind == "sent":
                self.sent += 1
            elif sample is not None and sample.ok:
                self.ok += 1
            else:
                self.failed += 1
        self._refresh()

    def _refresh(self, final: bool = False) -> None:
        elapsed = self.total_s if final else min(self.total_s, time.perf_counter() - self._started)
        in_flight = self.sent - self.ok - self.failed
        counts = (
            f"{self.step_label}  sent {self.sent}  ok {self.ok}  failed {self.failed}  in flight {in_flight}"
        )
        self._progress.update(self._task, completed=elapsed, counts=counts.strip())


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _p50_95_99(d: Distribution) -> str:
    return f"{_ms(d.p50_ms)}/{_ms(d.p95_ms)}/{_ms(d.p99_ms)}"


def cpu_text(step: StepSummary) -> str:
    cores = getattr(step, "cpu_cores", None)
    return "-" if cores is None else f"{cores:.2f}"


def gpu_text(step: StepSummary) -> str:
    """``no GPU`` on CPU hosts (never a 0 %), utilisation and peak memory where the runtime exports
    them, ``-`` where its /metrics was not read or says nothing of GPUs."""
    gpus = getattr(step, "gpus", None)
    if gpus is None:
        return "-"
    if gpus == 0:
        return "no GPU"
    util, memory = getattr(step, "gpu_util_pct", None), getattr(step, "gpu_memory_bytes", None)
    if util is None or memory is None:
        return f"{gpus} GPU, not exported"
    return f"{util:.0f}% {memory / 2**30:,.1f} GiB"


def steps_table(steps: Sequence[StepSummary], slo: SloTargets, knee: Knee | None = None) -> Table:
    """One row per step: load, throughput, goodput, latency percentiles, the replicas' CPU and GPU
    use and the SLO verdict.

    Why a step breaks the SLO, and its errors by kind, are listed by :func:`step_notes` below it.
    """
    table = Table(title="load test", title_justify="left")
    for name in ("offered/s", "sent", "failed", "tput/s", "out tok/s", "goodput/s", "met SLO"):
        table.add_column(name, justify="right")
    for name in ("TTFT ms p50/95/99", "TPOT ms p50/99", "ITL ms p50/95/99", "E2EL ms p50/90/95/99"):
        table.add_column(name, justify="right")
    table.add_column("prefix hit", justify="right")
    table.add_column("CPU/replica", justify="right")
    table.add_column("GPU", justify="right")
    table.add_column("SLO")
    for s in steps:
        load = f"{s.offered_rps:g}" if s.offered_rps is not None else f"c={s.concurrency}"
        mark = "ok" if not s.verdict(slo) else "[red]broken[/]"
        if knee is not None and s is knee.step:
            mark = "[green]ok, knee[/]"
        table.add_row(
            load,
            str(s.sent),
            str(s.failed),
            f"{s.throughput_rps:.2f}",
            f"{s.output_tokens_per_s:,.0f}",
            f"{s.goodput_rps:.2f}",
            f"{s.attainment:.0%}" if s.completed else "-",
            _p50_95_99(s.ttft),
            f"{_ms(s.tpot.p50_ms)}/{_ms(s.tpot.p99_ms)}",
            _p50_95_99(s.itl),
            f"{_ms(s.e2el.p50_ms)}/{_ms(s.e2el.p90_ms)}/{_ms(s.e2el.p95_ms)}/{_ms(s.e2el.p99_ms)}",
            "-" if (hit := getattr(s, "prefix_cache_hit_rate", None)) is None else f"{hit:.0%}",
            cpu_text(s),
            gpu_text(s),
            mark,
        )
    return table


def length_table(buckets: Sequence[LengthBucket]) -> Table:
    """The run's completed requests by prompt length: TTFT, ITL and E2EL percentiles per range."""
    table = Table(title="by input length (prompt tokens)", title_justify="left")
    table.add_column("prompt tokens")
    table.add_column("requests", justify="right")
    for name in ("TTFT ms p50/95/99", "ITL ms p50/95/99", "E2EL ms p50/95/99"):
        table.add_column(name, justify="right")
    for b in buckets:
        table.add_row(b.label, str(b.requests), _p50_95_99(b.ttft), _p50_95_99(b.itl), _p50_95_99(b.e2el))
    return table


def step_notes(steps: Sequence[StepSummary], slo: SloTargets) -> list[str]:
    """One line per step that failed requests or broke the SLO: errors by kind, and why."""
    notes = []
    for s in steps:
        load = f"{s.offered_rps:g} req/s" if s.offered_rps is not None else f"{s.concurrency} clients"
        parts = []
        if s.errors:
            parts.append("errors " + ", ".join(f"{kind} x{n}" for kind, n in sorted(s.errors.items())))
        parts += s.verdict(slo)
        if parts:
            notes.append(f"{load}: " + "; ".join(parts))
    return notes


def knee_line(knee: Knee | None, steps: Sequence[StepSummary]) -> str:
    if knee is None:
        lowest = min((s.offered_rps for s in steps if s.offered_rps is not None), default=None)
        return f"knee: none — the lowest step ({lowest} req/s) already breaks the SLO; sweep lower rates"
    text = f"knee: {knee.rate_rps:g} req/s per endpoint (p99 E2EL {knee.step.e2el.p99_ms:,.0f} ms)"
    if knee.broke_at_rps is not None:
        return text + f"; at {knee.broke_at_rps:g} req/s: " + "; ".join(knee.broke_because)
    return text + "; every step held — sweep higher rates to find where it breaks"


def plot(steps: Sequence[StepSummary], slo: SloTargets, knee: Knee | None, out: Path, title: str) -> Path:
    """Latency percentiles against offered load, with the SLO line and the knee, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = sorted((s for s in steps if s.offered_rps is not None), key=lambda s: s.offered_rps or 0)
    x = [s.offered_rps for s in rated]
    fig, (lat, tput) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, values, style in (
        ("E2EL p50", [s.e2el.p50_ms for s in rated], "o-"),
        ("E2EL p90", [s.e2el.p90_ms for s in rated], "s-"),
        ("E2EL p95", [s.e2el.p95_ms for s in rated], "d-"),
        ("E2EL p99", [s.e2el.p99_ms for s in rated], "^-"),
        ("TTFT p99", [s.ttft.p99_ms for s in rated], "v--"),
    ):
        lat.plot(x, values, style, label=label)
    lat.axhline(slo.p99_latency_ms, color="red", linestyle=":", label=f"SLO p99 {slo.p99_latency_ms:g} ms")
    if knee is not None:
        lat.axvline(knee.rate_rps, color="green", linestyle="--", label=f"knee {knee.rate_rps:g}/s")
    lat.set_xlabel("offered load (req/s)")
    lat.set_ylabel("latency (ms)")
    lat.set_yscale("log")
    lat.legend(fontsize=8)
    lat.grid(True, alpha=0.3)
    tput.plot(x, x, ":", color="grey", label="offered")
    tput.plot(x, [s.throughput_rps for s in rated], "o-", label="throughput")
    tput.plot(x, [s.goodput_rps for s in rated], "s-", label="goodput")
    tput.set_xlabel("offered load (req/s)")
    tput.set_ylabel("requests/s")
    tput.legend(fontsize=8)
    tput.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


@dataclass(frozen=True)
class ScalingTarget:
    """The autoscaling target a concurrency knee measures: requests running per replica, as the
    share of the runtime's ``max_concurrency`` that ``node_groups[].scale_in_utilisation`` holds
    (every target reads it: the EC2 group's scale-in, KEDA's running trigger, the local autoscaler)."""

    group: str
    running_per_replica: float
    max_concurrency: int
    utilisation: float
    capped: bool  # the knee lay above max_concurrency: the runtime queues the rest anyway

    def lines(self, knee: ConcurrencyKnee) -> list[str]:
        why = (
            f"knee: {knee.concurrency} requests in flight (mean E2EL x{knee.latency_ratio:.2f} for "
            f"throughput x{knee.throughput_ratio:.2f} at {knee.next_concurrency})"
            if knee.next_concurrency is not None
            else f"knee: at or above {knee.concurrency} requests in flight (the sweep's top; sweep higher)"
        )
        cap = f", capped at runtime.max_concurrency {self.max_concurrency}" if self.capped else ""
        return [
            why,
            f"autoscaling target: {self.running_per_replica:g} running per replica of "
            f"runtime.max_concurrency {self.max_concurrency}{cap}; in the stack file:",
            "  node_groups:",
            f"    - name: {self.group}",
            f"      scale_in_utilisation: {self.utilisation:g}"
            f"  # measured knee, {self.running_per_replica:g}/{self.max_concurrency}",
        ]


def scaling_target(knee: ConcurrencyKnee, replicas: int, group: str, max_concurrency: int) -> ScalingTarget:
    """The knee per replica as the group's ``scale_in_utilisation`` (0.01..1, two decimals)."""
    per_replica = knee.concurrency / replicas
    share = per_replica / max_concurrency
    return ScalingTarget(
        group=group,
        running_per_replica=round(per_replica, 2),
        max_concurrency=max_concurrency,
        utilisation=min(1.0, max(0.01, round(share, 2))),
        capped=share > 1,
    )
