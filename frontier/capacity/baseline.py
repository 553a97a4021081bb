"""A stack's measured capacity baseline: what one replica sustains at the knee of a load test.

The load test writes it (``stacks/baselines/<stack>.json``, pretty JSON, kept in git beside the stack
it describes); the planner reads it in place of ``capacity.assumed_replica_qps``.

Each baseline is also archived under the release it was measured on,
``stacks/baselines/<stack>/<release id>.json`` (a later measurement of the same release replaces
that release's entry), so ``fab baseline.diff A B`` can compare two releases figure by figure
before and after an upgrade. The file ``<stack>.json`` stays the latest measurement, whatever its
release. A baseline measured where the release was unknown is not archived.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

from frontier_hostside.names import RELEASE_ID_PATTERN

from frontier.errors import FrontierError
from frontier.project import stacks_dir

#: The figures a diff compares, and whether more is better (throughput) or worse (latency, CPU).
FIGURES: tuple[tuple[str, bool], ...] = (
    ("replica_qps", True),
    ("output_tokens_per_s", True),
    ("p50_latency_ms", False),
    ("p95_latency_ms", False),
    ("p99_latency_ms", False),
    ("ttft_p50_ms", False),
    ("ttft_p95_ms", False),
    ("ttft_p99_ms", False),
    ("itl_p50_ms", False),
    ("itl_p95_ms", False),
    ("itl_p99_ms", False),
    ("cpu_cores", False),
    ("gpu_util_pct", True),
    ("gpu_memory_bytes", False),
)
#: The figures of each input-length range a diff compares (all latencies: lower is better).
LENGTH_FIGURES = ("ttft_p95_ms", "itl_p95_ms", "e2el_p95_ms")
GPU_FIGURES = ("gpu_util_pct", "gpu_memory_bytes")
DEFAULT_REGRESSION_THRESHOLD = 0.10
#: What a figure is, as a diff's table names it (the field name is the archive's).
LABELS = {
    "replica_qps": "req/s per replica (knee)",
    "output_tokens_per_s": "output tok/s per replica",
    "p50_latency_ms": "E2E latency p50, ms",
    "p95_latency_ms": "E2E latency p95, ms",
    "p99_latency_ms": "E2E latency p99, ms",
    "ttft_p50_ms": "TTFT p50, ms",
    "ttft_p95_ms": "TTFT p95, ms",
    "ttft_p99_ms": "TTFT p99, ms",
    "itl_p50_ms": "ITL p50, ms",
    "itl_p95_ms": "ITL p95, ms",
    "itl_p99_ms": "ITL p99, ms",
    "cpu_cores": "CPU cores per replica",
    "gpu_util_pct": "GPU utilisation, %",
    "gpu_memory_bytes": "GPU memory per replica, bytes",
    "e2el_p95_ms": "E2E latency p95, ms",
}


@dataclass(frozen=True)
class LengthFigures:
    """One input-length range's latencies at the knee (``label`` as the load test names it: <256, ...)."""

    label: str
    requests: int
    ttft_p95_ms: float | None
    itl_p95_ms: float | None  # None where every request generated one token
    e2el_p95_ms: float | None


@dataclass(frozen=True)
class Baseline:
    """Per-replica figures at the knee: the highest offered rate that still met the stack's SLOs.

    The figures after ``release_id`` came later: a baseline measured before them has None (and no
    ranges), which a diff shows as not measured. ``gpus`` is 0 on CPU hosts, whose GPU figures are
    None: there is no GPU, not an idle one; None where the runtime's /metrics was not read.
    """

    stack: str
    measured_at: str  # ISO 8601, UTC
    replica_qps: float  # requests/s one replica sustains at the knee
    output_tokens_per_s: float  # output tokens/s of one replica at the knee
    p50_latency_ms: float
    p99_latency_ms: float
    ttft_p99_ms: float
    hosts_measured: int
    release_id: str
    p95_latency_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None
    cpu_cores: float | None = None  # CPU seconds per second of one replica's runtime at the knee
    gpus: int | None = None  # per replica
    gpu_util_pct: float | None = None
    gpu_memory_bytes: float | None = None  # per replica
    by_length: tuple[LengthFigures, ...] = ()

    def __post_init__(self) -> None:
        for name in ("replica_qps", "output_tokens_per_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise FrontierError(
                    f"baseline for stack {self.stack!r}: {name} = {value!r}: must be a number > 0"
                )
        if not isinstance(self.hosts_measured, int) or self.hosts_measured < 1:
            raise FrontierError(
                f"baseline for stack {self.stack!r}: hosts_measured = {self.hosts_measured!r}: must be an integer >= 1"
            )


def baselines_dir() -> Path:
    return stacks_dir() / "baselines"


def baseline_path(stack: str) -> Path:
    return baselines_dir() / f"{stack}.json"


def archive_dir(stack: str) -> Path:
    return baselines_dir() / stack


def archive_path(stack: str, release_id: str) -> Path:
    return archive_dir(stack) / f"{release_id}.json"


def load_baseline(stack: str) -> Baseline | None:
    """The stack's baseline, or None when none was measured yet. A damaged file is an error."""
    path = baseline_path(stack)
    if not path.exists():
        return None
    return _read(path, stack)


def _read(path: Path, stack: str) -> Baseline:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FrontierError(f"{path}: not valid JSON: {exc}") from None
    allowed = {f.name for f in fields(Baseline)}
    required = {f.name for f in fields(Baseline) if f.default is MISSING}
    if not isinstance(data, dict) or not required <= set(data) <= allowed:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise FrontierError(
            f"{path}: expected the fields {sorted(required)} and any of {sorted(allowed - required)}, got {got}"
        )
    if data["stack"] != stack:
        raise FrontierError(f"{path}: stack = {data['stack']!r}, but this is the baseline file of {stack!r}")
    try:
        ranges = tuple(LengthFigures(**r) for r in data.pop("by_length", []))
    except TypeError as exc:
        raise FrontierError(f"{path}: by_length: {exc}") from None
    try:
        return Baseline(**data, by_length=ranges)
    except FrontierError as exc:
        raise FrontierError(f"{path}: {exc}") from None


def save_baseline(baseline: Baseline) -> Path:
    """Write the baseline atomically as the stack's latest, archive it under its release; return the latest's path."""
    path = baseline_path(baseline.stack)
    _write(path, baseline)
    if RELEASE_ID_PATTERN.match(baseline.release_id):
        _write(archive_path(baseline.stack, baseline.release_id), baseline)
    return path


def _write(path: Path, baseline: Baseline) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # A figure not measured is left out, not written as null: the file says what was measured.
    data = {k: v for k, v in asdict(baseline).items() if v is not None and v != ()}
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def archived_releases(stack: str) -> list[str]:
    """The releases of ``stack`` with an archived baseline, oldest measurement first."""
    folder = archive_dir(stack)
    if not folder.is_dir():
        return []
    found = [_read(p, stack) for p in folder.glob("*.json") if RELEASE_ID_PATTERN.match(p.stem)]
    return [b.release_id for b in sorted(found, key=lambda b: b.measured_at)]


def load_archived(stack: str, release_id: str) -> Baseline:
    """The baseline measured on ``release_id``; an error naming the archived releases if there is none."""
    if not RELEASE_ID_PATTERN.match(release_id):
        raise FrontierError(
            f"release id {release_id!r} is malformed: expected 'r-' followed by 12 lowercase hex digits"
        )
    path = archive_path(stack, release_id)
    if not path.is_file():
        known = ", ".join(archived_releases(stack)) or "none yet (fab loadtest archives one per release)"
        raise FrontierError(f"no baseline of release {release_id} for stack {stack!r}; archived: {known}")
    baseline = _read(path, stack)
    if baseline.release_id != release_id:
        raise FrontierError(
            f"{path}: release_id = {baseline.release_id!r}, but the file is named for {release_id}"
        )
    return baseline


@dataclass(frozen=True)
class FigureDiff:
    """One figure of two baselines: ``ratio`` is after / before; a regression moved the wrong way by
    more than the threshold. ``before`` or ``after`` is None where that baseline has no such figure:
    its ``note`` says why (not measured, or no GPU), and the figure is never a regression."""

    name: str
    before: float | None
    after: float | None
    higher_is_better: bool
    ratio: float
    regression: bool
    threshold: float = DEFAULT_REGRESSION_THRESHOLD
    before_note: str = ""
    after_note: str = ""
    #: The input-length range of a per-range figure ("" for the whole run's).
    length: str = ""

    @property
    def label(self) -> str:
        text = LABELS.get(self.name, self.name)
        return f"{text}, prompts {self.length}" if self.length else text

    @property
    def change(self) -> str:
        """B against A in percent, signed: ``+12.5 %``."""
        if self.before is None or self.after is None:
            return "-"
        if math.isinf(self.ratio):
            return "new"
        return f"{(self.ratio - 1) * 100:+.1f} %"

    @property
    def verdict(self) -> str:
        """``REGRESSION`` beyond the threshold the wrong way, ``better`` beyond it the right way,
        else within the threshold (measurement noise on a shared machine is of that order)."""
        if self.before is None or self.after is None:
            return "not compared"
        if self.regression:
            return "REGRESSION"
        improved = (
            self.ratio > 1 + self.threshold if self.higher_is_better else self.ratio < 1 - self.threshold
        )
        return "better" if improved else f"same (within ±{self.threshold:.0%})"


def _note(baseline: Baseline, name: str) -> str:
    if name in GPU_FIGURES and baseline.gpus == 0:
        return "no GPU"
    return "not measured"


def _compare(
    name: str, a: float | None, b: float | None, higher_is_better: bool, threshold: float
) -> tuple[float, bool]:
    if a is None or b is None:
        return 1.0, False
    ratio = b / a if a else (math.inf if b else 1.0)
    worse = ratio < 1 - threshold if higher_is_better else ratio > 1 + threshold
    return ratio, worse


def diff_baselines(
    before: Baseline, after: Baseline, threshold: float = DEFAULT_REGRESSION_THRESHOLD
) -> list[FigureDiff]:
    """Every figure of ``after`` against ``before``, regressions flagged beyond ``threshold`` (0.10 = 10 %):
    the whole run's, then each input-length range both measured."""
    if not (isinstance(threshold, int | float) and 0 < threshold < 10):
        raise FrontierError(f"--threshold = {threshold!r}: must be a fraction > 0 and < 10 (0.10 = 10 %)")
    diffs = []
    for name, higher_is_better in FIGURES:
        a, b = getattr(before, name), getattr(after, name)
        a, b = (None if a is None else float(a)), (None if b is None else float(b))
        ratio, worse = _compare(name, a, b, higher_is_better, threshold)
        diffs.append(
            FigureDiff(
                name, a, b, higher_is_better, ratio, worse, float(threshold),
                before_note="" if a is not None else _note(before, name),
                after_note="" if b is not None else _note(after, name),
            )
        )  # fmt: skip
    ranges_after = {r.label: r for r in after.by_length}
    for range_a in before.by_length:
        range_b = ranges_after.get(range_a.label)
        if range_b is None:
            continue
        for name in LENGTH_FIGURES:
            a, b = getattr(range_a, name), getattr(range_b, name)
            if a is None or b is None:
                continue
            ratio, worse = _compare(name, a, b, False, threshold)
            diffs.append(FigureDiff(name, a, b, False, ratio, worse, float(threshold), length=range_a.label))
    return diffs
