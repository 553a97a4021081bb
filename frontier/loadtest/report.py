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
from frontier_hostside.names import PREFIX_CACHE_HITS_METRIC, PREFIX_CACHE_QUERIES_METRIC
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from frontier.loadtest.client import Target, run_concurrency, run_steps
from frontier.loadtest.stats import Knee, LengthBucket, RequestSample, SloTargets, StepSummary, summarize


def wide_console() -> Console:
    """A console for tables: the terminal's width, or 160 columns when the output is a file or pipe."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=160)


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
    """A step with what the runtime's /metrics said about it: the share of prompt tokens found in
    its prefix cache (None where /metrics could not be read, e.g. behind a balancer that hides it)."""

    prefix_cache_hit_rate: float | None = None


def prefix_cache_counters(target: Target) -> tuple[float, float] | None:
    """(prompt tokens looked up, found) in the prefix cache, summed over /metrics; None if unreadable."""
    try:
        text = httpx.get(target.base_url.rstrip("/") + "/metrics", headers=target.headers(), timeout=5).text
    except httpx.HTTPError:
        return None
    totals = {PREFIX_CACHE_QUERIES_METRIC: 0.0, PREFIX_CACHE_HITS_METRIC: 0.0}
    seen = False
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
        if name in totals and not line.startswith("#"):
            totals[name] += float(line.rsplit(" ", 1)[1])
            seen = True
    return (totals[PREFIX_CACHE_QUERIES_METRIC], totals[PREFIX_CACHE_HITS_METRIC]) if seen else None


class _PrefixCacheSnapshots:
    """/metrics read at each step's start (on a thread, so the load's event loop never waits) and at
    the end; step i's hit rate is the change between snapshot i and i + 1."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.threads: dict[int, threading.Thread] = {}
        self.values: dict[int, tuple[float, float] | None] = {}

    def take(self, index: int) -> None:
        def read() -> None:
            self.values[index] = prefix_cache_counters(self.target)

        self.threads[index] = thread = threading.Thread(target=read, daemon=True)
        thread.start()

    def rates(self, steps: int) -> list[float | None]:
        for thread in self.threads.values():
            thread.join(10)
        out: list[float | None] = []
        for i in range(steps):
            before, after = self.values.get(i), self.values.get(i + 1)
            if before is None or after is None or after[0] <= before[0]:
                out.append(None)
            else:
                out.append((after[1] - before[1]) / (after[0] - before[0]))
        return out


def _with_prefix_cache(steps: list[StepSummary], rates: list[float | None]) -> list[StepSummary]:
    return [
        ServedStep(**{f.name: getattr(s, f.name) for f in fields(StepSummary)}, prefix_cache_hit_rate=r)
        for s, r in zip(steps, rates, strict=True)
    ]


def measure(target: Target, shape: LoadShape, slo: SloTargets, console: Console) -> list[StepSummary]:
    """Run the load with a live progress bar; one summary per step (one for a single rate or loop)."""
    snapshots = _PrefixCacheSnapshots(target)
    snapshots.take(0)
    with LiveProgress(console, shape.total_s, shape.label) as progress:
        if shape.concurrency is not None:
            result = asyncio.run(
                run_concurrency(
                    target, shape.concurrency, shape.seconds, seed=shape.seed, on_event=progress.on_event
                )
            )
            snapshots.take(1)
            step = summarize(result.samples, window=result.window, slo=slo, concurrency=shape.concurrency)
            return _with_prefix_cache([step], snapshots.rates(1))

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
        summarize(r.samples, window=r.window, slo=slo, offered_rps=r.rate_rps, completions=everything)
        for r in results
    ]
    return _with_prefix_cache(steps, snapshots.rates(len(steps)))


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


def steps_table(steps: Sequence[StepSummary], slo: SloTargets, knee: Knee | None = None) -> Table:
    """One row per step: load, throughput, goodput, latency percentiles and the SLO verdict.

    Why a step breaks the SLO, and its errors by kind, are listed by :func:`step_notes` below it.
    """
    table = Table(title="load test", title_justify="left")
    for name in ("offered/s", "sent", "failed", "tput/s", "out tok/s", "goodput/s", "met SLO"):
        table.add_column(name, justify="right")
    for name in ("TTFT p50/p95/p99", "TPOT p50/p99", "ITL p99", "E2EL p50/p90/p95/p99"):
        table.add_column(f"{name} ms", justify="right")
    table.add_column("prefix hit", justify="right")
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
            f"{_ms(s.ttft.p50_ms)}/{_ms(s.ttft.p95_ms)}/{_ms(s.ttft.p99_ms)}",
            f"{_ms(s.tpot.p50_ms)}/{_ms(s.tpot.p99_ms)}",
            _ms(s.itl.p99_ms),
            f"{_ms(s.e2el.p50_ms)}/{_ms(s.e2el.p90_ms)}/{_ms(s.e2el.p95_ms)}/{_ms(s.e2el.p99_ms)}",
            "-" if (hit := getattr(s, "prefix_cache_hit_rate", None)) is None else f"{hit:.0%}",
            mark,
        )
    return table


def length_table(buckets: Sequence[LengthBucket]) -> Table:
    """The run's completed requests by prompt length: TTFT and E2EL percentiles per range."""
    table = Table(title="by input length (prompt tokens)", title_justify="left")
    table.add_column("prompt tokens")
    table.add_column("requests", justify="right")
    for name in ("TTFT p50/p95/p99", "E2EL p50/p95/p99"):
        table.add_column(f"{name} ms", justify="right")
    for b in buckets:
        table.add_row(
            b.label,
            str(b.requests),
            f"{_ms(b.ttft.p50_ms)}/{_ms(b.ttft.p95_ms)}/{_ms(b.ttft.p99_ms)}",
            f"{_ms(b.e2el.p50_ms)}/{_ms(b.e2el.p95_ms)}/{_ms(b.e2el.p99_ms)}",
        )
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
