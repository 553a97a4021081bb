"""A soak: a stack held at a fraction of its knee for a long time, judged for leaks and drift.

A load test finds how much a stack serves; a soak finds what only time shows: memory that grows
with every request, KV cache blocks that are never given back, error rates or latencies that creep
up, replicas that restart. A steady Poisson load runs for the whole duration while every replica's
``/metrics`` is read at a fixed interval (through the host agent, as the rollout gate reads it: the
runtime port is never opened to the operator). At the end the load stops, the replicas are read
once more idle, and each check is judged against its limit:

- resident memory: the least-squares slope of each replica's RSS over the soak, after the first
  tenth (allocator pools and caches fill while the load ramps up), in MB per hour;
- KV cache: the peak usage while loaded (the cache must never fill), and the usage once idle against
  the usage before the load began (blocks still held by no request are a leak);
- error rate and p99 latency: the last quarter of the soak against the first;
- restarts: a replica whose ``process_start_time_seconds`` changed, or that stopped answering.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from frontier_hostside.names import KV_USAGE_METRIC, PROCESS_RSS_METRIC, PROCESS_START_METRIC
from prometheus_client.parser import text_string_to_metric_families

from frontier.errors import FrontierError
from frontier.loadtest.client import BackgroundLoad, Target
from frontier.loadtest.stats import RequestSample, percentile

MB = 1 << 20


class SoakError(FrontierError):
    """A soak that cannot start: bad settings, or no replica to read."""


@dataclass(frozen=True)
class SoakLimits:
    rss_growth_mb_per_h: float = 64.0
    kv_peak_usage: float = 0.95
    kv_idle_growth: float = 0.02  # idle usage after the soak over idle usage before it
    error_rate_drift: float = 0.005  # last quarter's error rate over the first quarter's
    p99_drift: float = 1.5  # last quarter's p99 latency / the first quarter's
    restarts: int = 0

    def __post_init__(self) -> None:
        for name in ("rss_growth_mb_per_h", "kv_idle_growth", "error_rate_drift"):
            if not getattr(self, name) >= 0:
                raise SoakError(f"--{name.replace('_', '-')} {getattr(self, name)!r}: must be >= 0")
        if not 0 < self.kv_peak_usage <= 1:
            raise SoakError(f"--kv-peak-usage {self.kv_peak_usage!r}: must lie in (0, 1]")
        if not self.p99_drift >= 1:
            raise SoakError(f"--p99-drift {self.p99_drift!r}: must be >= 1 (a ratio of p99 latencies)")


@dataclass(frozen=True)
class ReplicaReading:
    """One replica's /metrics at one moment (None fields: it did not answer, or lacks the metric)."""

    at: float  # seconds since the soak began
    replica: str
    rss_bytes: float | None
    kv_usage: float | None
    started_at: float | None


def read_replica(replica: str, at: float, metrics_text: str | None) -> ReplicaReading:
    """What a soak keeps of one scrape of a runtime's /metrics."""
    if metrics_text is None:
        return ReplicaReading(at, replica, None, None, None)
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in (PROCESS_RSS_METRIC, PROCESS_START_METRIC, KV_USAGE_METRIC):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return ReplicaReading(
        at,
        replica,
        values.get(PROCESS_RSS_METRIC),
        values.get(KV_USAGE_METRIC),
        values.get(PROCESS_START_METRIC),
    )


@dataclass(frozen=True)
class Window:
    """The requests that finished in one interval of the soak, and the replicas' readings after it."""

    start: float
    end: float
    samples: tuple[RequestSample, ...]
    readings: tuple[ReplicaReading, ...]

    @property
    def failed(self) -> int:
        return sum(1 for s in self.samples if not s.ok)

    @property
    def error_rate(self) -> float:
        return self.failed / len(self.samples) if self.samples else 0.0


@dataclass(frozen=True)
class Check:
    name: str
    measured: str
    limit: str
    ok: bool


@dataclass(frozen=True)
class SoakReport:
    rate: float
    duration_s: float
    windows: tuple[Window, ...]
    idle_before: tuple[ReplicaReading, ...]
    idle_after: tuple[ReplicaReading, ...]
    checks: tuple[Check, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def sent(self) -> int:
        return sum(len(w.samples) for w in self.windows)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.windows)


def run_soak(
    target: Target,
    replicas: Sequence[str],
    read_metrics: Callable[[str], str | None],
    *,
    rate: float,
    duration_s: float,
    interval_s: float,
    limits: SoakLimits,
    seed: int = 0,
    on_window: Callable[[Window], None] | None = None,
) -> SoakReport:
    """Hold ``rate`` requests/s against ``target`` for ``duration_s``, reading every replica's
    /metrics (``read_metrics(replica)``, None when it does not answer) each ``interval_s``."""
    if not replicas:
        raise SoakError("no replica to read: the stack has no host serving")
    if duration_s < 4 * interval_s:
        raise SoakError(
            f"--duration {duration_s:g}s: must be at least 4 x --interval ({interval_s:g}s), "
            "so the first and last quarters are windows apart"
        )

    def read_all(at: float) -> tuple[ReplicaReading, ...]:
        return tuple(read_replica(r, at, read_metrics(r)) for r in replicas)

    idle_before = read_all(0.0)
    load = BackgroundLoad(target, rate, seed=seed).start()
    began = time.monotonic()
    windows: list[Window] = []
    taken = 0
    try:
        while (now := time.monotonic() - began) < duration_s:
            time.sleep(min(interval_s, duration_s - now))
            at = time.monotonic() - began
            samples = load.samples()
            fresh = tuple(samples[taken:])
            taken = len(samples)
            window = Window(windows[-1].end if windows else 0.0, at, fresh, read_all(at))
            windows.append(window)
            if on_window is not None:
                on_window(window)
    finally:
        rest = load.stop()
    if len(rest) > taken and windows:
        last = windows[-1]
        windows[-1] = Window(last.start, last.end, last.samples + tuple(rest[taken:]), last.readings)
    time.sleep(min(interval_s, 5.0))  # the last streams close and their blocks are freed
    idle_after = read_all(time.monotonic() - began)
    report = SoakReport(rate, duration_s, tuple(windows), idle_before, idle_after)
    return replace(report, checks=judge(report, limits))


def judge(report: SoakReport, limits: SoakLimits) -> tuple[Check, ...]:
    """Each check of the soak against its limit."""
    windows = report.windows
    readings = [r for w in windows for r in w.readings]
    replicas = sorted({r.replica for r in readings})
    checks = []
    for replica in replicas:
        mine = [r for r in readings if r.replica == replica and r.rss_bytes is not None]
        settled = [r for r in mine if r.at >= report.duration_s / 10]
        slope = rss_slope_mb_per_h(settled)
        checks.append(
            Check(
                f"RSS growth, {replica}",
                "-" if slope is None else f"{slope:+.1f} MB/h ({_mb(settled[0])} -> {_mb(settled[-1])})",
                f"<= {limits.rss_growth_mb_per_h:g} MB/h",
                slope is not None and slope <= limits.rss_growth_mb_per_h,
            )
        )
    peak = max((r.kv_usage for r in readings if r.kv_usage is not None), default=None)
    checks.append(
        Check(
            "KV cache peak usage",
            "-" if peak is None else f"{peak:.0%}",
            f"<= {limits.kv_peak_usage:.0%}",
            peak is not None and peak <= limits.kv_peak_usage,
        )
    )
    before = _kv_sum(report.idle_before)
    after = _kv_sum(report.idle_after)
    checks.append(
        Check(
            "KV cache usage idle, after vs before",
            "-" if before is None or after is None else f"{before:.1%} -> {after:.1%}",
            f"growth <= {limits.kv_idle_growth:.0%}",
            before is not None and after is not None and after - before <= limits.kv_idle_growth,
        )
    )
    first, last = _quarter(windows, first=True), _quarter(windows, first=False)
    rate_first, rate_last = _error_rate(first), _error_rate(last)
    checks.append(
        Check(
            "error rate, last quarter vs first",
            f"{rate_first:.2%} -> {rate_last:.2%}",
            f"rise <= {limits.error_rate_drift:.2%}",
            rate_last - rate_first <= limits.error_rate_drift,
        )
    )
    p99_first, p99_last = p99_of(first), p99_of(last)
    ratio = p99_last / p99_first if p99_first and p99_last else None
    checks.append(
        Check(
            "p99 latency, last quarter vs first",
            "-" if ratio is None else f"{p99_first * 1e3:.0f} -> {p99_last * 1e3:.0f} ms ({ratio:.2f}x)",  # type: ignore[operator]
            f"<= {limits.p99_drift:g}x",
            ratio is not None and ratio <= limits.p99_drift,
        )
    )
    restarts = count_restarts([*report.idle_before, *readings, *report.idle_after])
    checks.append(
        Check(
            "restarts or replicas not answering",
            ", ".join(f"{r}: {n}" for r, n in restarts.items() if n) or "0",
            f"<= {limits.restarts}",
            all(n <= limits.restarts for n in restarts.values()),
        )
    )
    return tuple(checks)


def rss_slope_mb_per_h(readings: Sequence[ReplicaReading]) -> float | None:
    """The least-squares slope of RSS over time, in MB per hour (None with fewer than 3 readings)."""
    points = [(r.at, r.rss_bytes) for r in readings if r.rss_bytes is not None]
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (y - mean_y) for t, y in points) / spread  # bytes per second
    return slope * 3600 / MB


def count_restarts(readings: Sequence[ReplicaReading]) -> dict[str, int]:
    """Per replica: how often its start time changed, plus the readings where it did not answer."""
    counts: dict[str, int] = {}
    last_start: dict[str, float] = {}
    for r in readings:
        counts.setdefault(r.replica, 0)
        if r.started_at is None:
            counts[r.replica] += 1
            continue
        previous = last_start.get(r.replica)
        if previous is not None and not math.isclose(previous, r.started_at):
            counts[r.replica] += 1
        last_start[r.replica] = r.started_at
    return counts


def _quarter(windows: Sequence[Window], *, first: bool) -> list[RequestSample]:
    n = max(1, len(windows) // 4)
    chosen = windows[:n] if first else windows[-n:]
    return [s for w in chosen for s in w.samples]


def _error_rate(samples: list[RequestSample]) -> float:
    return sum(1 for s in samples if not s.ok) / len(samples) if samples else 0.0


def p99_of(samples: list[RequestSample]) -> float | None:
    """The 99th percentile of the successful requests' end-to-end latency, in seconds."""
    latencies = [s.e2el_s for s in samples if s.ok and s.e2el_s is not None]
    return percentile(latencies, 99) if latencies else None


def _kv_sum(readings: Sequence[ReplicaReading]) -> float | None:
    values = [r.kv_usage for r in readings if r.kv_usage is not None]
    return sum(values) / len(values) if values else None


def _mb(reading: ReplicaReading) -> str:
    return "-" if reading.rss_bytes is None else f"{reading.rss_bytes / MB:.0f} MB"
