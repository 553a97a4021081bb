"""Statistics of a load test: per-request samples in, percentiles, goodput and the knee out.

Definitions follow vLLM's ``benchmark_serving`` and genai-perf:

* **TTFT** — send time to the first streamed chunk whose ``choices`` carry text.
* **ITL** — gaps between consecutive content chunks, pooled over every request of a step.
* **TPOT** — per request, ``(E2EL - TTFT) / (output_tokens - 1)``; undefined for a single token.
* **E2EL** — send time to the last chunk of the stream.
* **Goodput** — requests per second that succeeded *and* met every SLO that is set (TTFT, TPOT and
  E2EL against ``slo.p99_latency_ms``), DistServe's definition.

Everything here is pure: the numbers come from :class:`RequestSample` lists, so the tests feed
hand-made samples and check hand-computed answers.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PERCENTILES = (50, 90, 95, 99)

# Achieved throughput "tracks" offered load while successful completions in a step's (lagged) window
# are at least this share of the requests sent in it. Below it the server has fallen behind.
DEFAULT_MIN_TRACKING = 0.8
# A step holds the per-request SLOs while at least this share of its completed requests met every one.
DEFAULT_MIN_ATTAINMENT = 0.9


@dataclass(frozen=True)
class SloTargets:
    """The stack's service-level objectives, in milliseconds (``slo.*`` of the stack file)."""

    ttft_ms: float
    tpot_ms: float
    p99_latency_ms: float
    error_rate: float


@dataclass(frozen=True)
class RequestSample:
    """One request as the client saw it. Times are seconds on the client's monotonic clock."""

    sent_at: float
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2el_s: float | None = None
    itl_s: tuple[float, ...] = ()
    output_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def finished_at(self) -> float:
        return self.sent_at + (self.e2el_s or 0.0)

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.e2el_s is None or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)

    def meets(self, slo: SloTargets) -> bool:
        """Whether this request counts towards goodput: it succeeded and met every SLO."""
        if not self.ok or self.ttft_s is None or self.e2el_s is None:
            return False
        if self.ttft_s * 1000 > slo.ttft_ms or self.e2el_s * 1000 > slo.p99_latency_ms:
            return False
        tpot = self.tpot_s
        return tpot is None or tpot * 1000 <= slo.tpot_ms


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between ranks (numpy's default); NaN if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q = {q}: must lie within 0..100")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of one metric, in milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float

    @classmethod
    def of_seconds(cls, values: Iterable[float]) -> Distribution:
        ms = [v * 1000 for v in values]
        mean = sum(ms) / len(ms) if ms else math.nan
        p50, p90, p95, p99 = (percentile(ms, q) for q in PERCENTILES)
        return cls(count=len(ms), mean_ms=mean, p50_ms=p50, p90_ms=p90, p95_ms=p95, p99_ms=p99)


@dataclass(frozen=True)
class StepSummary:
    """What one constant-rate step (or a whole single-rate run) measured.

    ``offered_rps`` is the nominal arrival rate (None for a fixed-concurrency run); ``sent_rps`` the
    realised one. ``throughput_rps`` counts successful completions inside the step's window shifted
    by the step's median end-to-end latency (``lag_s``): in a steady state the requests sent in
    ``[start, end]`` finish in ``[start + lag, end + lag]``, so a server that keeps up completes as
    many as were sent, and one that falls behind completes fewer while its queue grows.
    """

    offered_rps: float | None
    duration_s: float
    sent: int
    completed: int
    failed: int
    errors: dict[str, int]
    sent_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    goodput_rps: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    concurrency: int | None = None
    lag_s: float = 0.0
    met_slo: int = 0
    #: The completed requests split by prompt length (:func:`by_input_length`).
    by_length: tuple[LengthBucket, ...] = ()

    @property
    def attainment(self) -> float:
        """Share of the completed requests that met every per-request SLO (TTFT, TPOT, E2EL)."""
        return self.met_slo / self.completed if self.completed else 0.0

    @property
    def error_rate(self) -> float:
        return self.failed / self.sent if self.sent else 0.0

    @property
    def tracking(self) -> float:
        """Successful completions in the window per request sent in it (1.0 = keeping up)."""
        return self.throughput_rps / self.sent_rps if self.sent_rps else 0.0

    def verdict(
        self,
        slo: SloTargets,
        min_tracking: float = DEFAULT_MIN_TRACKING,
        min_attainment: float = DEFAULT_MIN_ATTAINMENT,
    ) -> list[str]:
        """Why this step breaks the SLO (empty when it holds). See :func:`find_knee`."""
        reasons = []
        if self.sent == 0:
            return ["no requests were sent"]
        if self.error_rate > slo.error_rate:
            reasons.append(f"error rate {self.error_rate:.1%} > {slo.error_rate:.1%}")
        if self.completed == 0:
            reasons.append("no request completed")
        elif self.e2el.p99_ms > slo.p99_latency_ms:
            reasons.append(f"p99 E2EL {self.e2el.p99_ms:.0f} ms > {slo.p99_latency_ms:.0f} ms")
        if self.completed and self.attainment < min_attainment:
            reasons.append(f"only {self.attainment:.1%} of requests met every SLO (< {min_attainment:.0%})")
        if self.tracking < min_tracking:
            reasons.append(
                f"throughput {self.throughput_rps:.2f}/s < {min_tracking:.0%} of {self.sent_rps:.2f}/s sent"
            )
        return reasons


def summarize(
    samples: Sequence[RequestSample],
    *,
    window: tuple[float, float],
    slo: SloTargets,
    offered_rps: float | None = None,
    concurrency: int | None = None,
    completions: Sequence[RequestSample] | None = None,
    length_edges: Sequence[int] = (),
) -> StepSummary:
    """Summarise the requests *sent* in ``window`` (start, end).

    Latencies describe those requests wherever they finished. Throughput counts the successful
    ``completions`` (default: ``samples``) that finished inside the window shifted by the median
    E2EL of this step's requests — during a step load pass every sample of the run, so a step's
    throughput includes the tail of the previous step, as a server would see it. ``length_edges``
    split the requests by prompt length (:func:`by_input_length`; the stack's
    ``capacity.input_length_edges``).
    """
    start, end = window
    duration = max(end - start, 1e-9)
    ok = [s for s in samples if s.ok]
    failed = [s for s in samples if not s.ok]
    lag = percentile([s.e2el_s for s in ok if s.e2el_s is not None], 50) if ok else 0.0
    finished = [
        s
        for s in (samples if completions is None else completions)
        if s.ok and start + lag <= s.finished_at <= end + lag
    ]
    met = sum(1 for s in ok if s.meets(slo))
    out_tokens = sum(s.output_tokens for s in finished)
    all_tokens = out_tokens + sum(s.prompt_tokens for s in finished)
    return StepSummary(
        offered_rps=offered_rps,
        concurrency=concurrency,
        duration_s=duration,
        sent=len(samples),
        completed=len(ok),
        failed=len(failed),
        errors=dict(Counter(s.error or "unknown" for s in failed)),
        sent_rps=len(samples) / duration,
        throughput_rps=len(finished) / duration,
        output_tokens_per_s=out_tokens / duration,
        total_tokens_per_s=all_tokens / duration,
        goodput_rps=met / duration,
        lag_s=lag,
        met_slo=met,
        ttft=Distribution.of_seconds(s.ttft_s for s in ok if s.ttft_s is not None),
        tpot=Distribution.of_seconds(t for s in ok if (t := s.tpot_s) is not None),
        itl=Distribution.of_seconds(gap for s in ok for gap in s.itl_s),
        e2el=Distribution.of_seconds(s.e2el_s for s in ok if s.e2el_s is not None),
        by_length=tuple(by_input_length(ok, length_edges)),
    )


@dataclass(frozen=True)
class Knee:
    """The capacity found by a step load: the highest offered rate that still held the SLO."""

    rate_rps: float
    step: StepSummary
    broke_at_rps: float | None = None
    broke_because: list[str] = field(default_factory=list)


def find_knee(
    steps: Sequence[StepSummary],
    slo: SloTargets,
    min_tracking: float = DEFAULT_MIN_TRACKING,
    min_attainment: float = DEFAULT_MIN_ATTAINMENT,
) -> Knee | None:
    """The knee of a step load.

    Steps are taken in increasing offered rate. A step *holds* when

    1. its error rate is at most ``slo.error_rate``;
    2. its p99 end-to-end latency is at most ``slo.p99_latency_ms``;
    3. at least ``min_attainment`` (default 90 %) of its completed requests met every per-request
       SLO — TTFT ``slo.ttft_ms``, TPOT ``slo.tpot_ms``, E2EL ``slo.p99_latency_ms`` — so a rate
       where most users wait past the TTFT target does not count as capacity;
    4. achieved throughput tracks offered load: successful completions inside the step's window,
       shifted by its median E2EL, are at least ``min_tracking`` (default 80 %) of the requests sent
       in it — below that a queue grows and latency only stays low because the step ended.

    The knee is the highest offered rate of the *unbroken run* of holding steps from the lowest rate:
    a step that holds after one that broke is noise past saturation, not capacity. ``None`` when the
    lowest step already breaks (capacity lies below the sweep).
    """
    ordered = sorted((s for s in steps if s.offered_rps is not None), key=lambda s: s.offered_rps or 0.0)
    knee: StepSummary | None = None
    for step in ordered:
        reasons = step.verdict(slo, min_tracking, min_attainment)
        if reasons:
            if knee is None:
                return None
            return Knee(
                rate_rps=knee.offered_rps or 0.0,
                step=knee,
                broke_at_rps=step.offered_rps,
                broke_because=reasons,
            )
        knee = step
    if knee is None:
        return None
    return Knee(rate_rps=knee.offered_rps or 0.0, step=knee)


@dataclass(frozen=True)
class LengthBucket:
    """The requests whose prompt was in one range of lengths (tokens, as the server counted them):
    ``low`` inclusive, ``high`` exclusive, None for the open top range."""

    low: int
    high: int | None
    #: Completed requests in the range (a failed one has no prompt length the server counted).
    requests: int
    ttft: Distribution
    itl: Distribution
    e2el: Distribution

    @property
    def label(self) -> str:
        if self.high is None:
            return "all" if self.low <= 1 else f">={_tokens(self.low)}"
        return f"<{_tokens(self.high)}" if self.low <= 1 else f"{_tokens(self.low)}-{_tokens(self.high)}"


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def by_input_length(samples: Iterable[RequestSample], edges: Sequence[int] = ()) -> list[LengthBucket]:
    """Completed requests split by prompt length at ``edges`` (e.g. 256, 1024, 4096: <256, 256-1k,
    1k-4k, >=4k), the ranges with none left out: latency grows with the prompt, so one figure over a
    mix hides it. No edges: one range of every request. Completed requests only: the server counts a
    prompt's tokens in its answer."""
    if any(b <= a for a, b in zip(edges, edges[1:], strict=False)) or any(e < 2 for e in edges):
        raise ValueError(f"input length edges {list(edges)}: must be >= 2 tokens and increase strictly")
    bounds = [1, *edges]
    groups: dict[int, list[RequestSample]] = {}
    for sample in samples:
        if not sample.ok or sample.prompt_tokens < 1:
            continue
        index = bisect.bisect_right(bounds, sample.prompt_tokens) - 1
        groups.setdefault(index, []).append(sample)
    buckets = []
    for index in sorted(groups):
        group = groups[index]
        buckets.append(
            LengthBucket(
                low=bounds[index],
                high=bounds[index + 1] if index + 1 < len(bounds) else None,
                requests=len(group),
                ttft=Distribution.of_seconds(s.ttft_s for s in group if s.ttft_s is not None),
                itl=Distribution.of_seconds(gap for s in group for gap in s.itl_s),
                e2el=Distribution.of_seconds(s.e2el_s for s in group if s.e2el_s is not None),
            )
        )
    return buckets


@dataclass(frozen=True)
class ConcurrencyKnee:
    """The knee of a concurrency sweep: the most requests in flight before latency rises faster
    than throughput. By Little's law concurrency = throughput x latency, so past the knee more than
    half of each added request's share goes to waiting rather than to work done."""

    concurrency: int
    step: StepSummary
    #: The next level of the sweep, and how much throughput and mean E2EL grew to it (None: the
    #: sweep never passed the knee, so it lies at or above its top).
    next_concurrency: int | None = None
    throughput_ratio: float | None = None
    latency_ratio: float | None = None


def concurrency_knee(steps: Sequence[StepSummary]) -> ConcurrencyKnee | None:
    """The knee of closed-loop steps at rising concurrency: the last level before the first step up
    whose mean E2EL grows by a larger factor than its throughput. None without two levels that
    completed requests."""
    levels = sorted(
        (s for s in steps if s.concurrency is not None and s.completed and s.throughput_rps > 0),
        key=lambda s: s.concurrency or 0,
    )
    if len(levels) < 2:
        return None
    for low, high in zip(levels, levels[1:], strict=False):
        throughput = high.throughput_rps / low.throughput_rps
        latency = high.e2el.mean_ms / low.e2el.mean_ms
        if latency > throughput:
            return ConcurrencyKnee(
                concurrency=low.concurrency or 0,
                step=low,
                next_concurrency=high.concurrency,
                throughput_ratio=throughput,
                latency_ratio=latency,
            )
    return ConcurrencyKnee(concurrency=levels[-1].concurrency or 0, step=levels[-1])
