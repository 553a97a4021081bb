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
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from frontier_hostside.names import RELEASE_ID_PATTERN

from frontier.errors import FrontierError
from frontier.project import stacks_dir

#: The figures a diff compares, and whether more is better (throughput) or worse (latency).
FIGURES: tuple[tuple[str, bool], ...] = (
    ("replica_qps", True),
    ("output_tokens_per_s", True),
    ("p50_latency_ms", False),
    ("p99_latency_ms", False),
    ("ttft_p99_ms", False),
)
DEFAULT_REGRESSION_THRESHOLD = 0.10
#: What a figure is, as a diff's table names it (the field name is the archive's).
LABELS = {
    "replica_qps": "req/s per replica (knee)",
    "output_tokens_per_s": "output tok/s per replica",
    "p50_latency_ms": "E2E latency p50, ms",
    "p99_latency_ms": "E2E latency p99, ms",
    "ttft_p99_ms": "TTFT p99, ms",
}


@dataclass(frozen=True)
class Baseline:
    """Per-replica figures at the knee: the highest offered rate that still met the stack's SLOs."""

    stack: str
    measured_at: str  # ISO 8601, UTC
    replica_qps: float  # requests/s one replica sustains at the knee
    output_tokens_per_s: float  # output tokens/s of one replica at the knee
    p50_latency_ms: float
    p99_latency_ms: float
    ttft_p99_ms: float
    hosts_measured: int
    release_id: str

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
    expected = {f.name for f in fields(Baseline)}
    if not isinstance(data, dict) or set(data) != expected:
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise FrontierError(f"{path}: expected the fields {sorted(expected)}, got {got}")
    if data["stack"] != stack:
        raise FrontierError(f"{path}: stack = {data['stack']!r}, but this is the baseline file of {stack!r}")
    try:
        return Baseline(**data)
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
    tmp.write_text(json.dumps(asdict(baseline), indent=2, sort_keys=True) + "\n")
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
    more than the threshold."""

    name: str
    before: float
    after: float
    higher_is_better: bool
    ratio: float
    regression: bool
    threshold: float = DEFAULT_REGRESSION_THRESHOLD

    @property
    def label(self) -> str:
        return LABELS.get(self.name, self.name)

    @property
    def change(self) -> str:
        """B against A in percent, signed: ``+12.5 %``."""
        if math.isinf(self.ratio):
            return "new"
        return f"{(self.ratio - 1) * 100:+.1f} %"

    @property
    def verdict(self) -> str:
        """``REGRESSION`` beyond the threshold the wrong way, ``better`` beyond it the right way,
        else within the threshold (measurement noise on a shared machine is of that order)."""
        if self.regression:
            return "REGRESSION"
        improved = (
            self.ratio > 1 + self.threshold if self.higher_is_better else self.ratio < 1 - self.threshold
        )
        return "better" if improved else f"same (within ±{self.threshold:.0%})"


def diff_baselines(
    before: Baseline, after: Baseline, threshold: float = DEFAULT_REGRESSION_THRESHOLD
) -> list[FigureDiff]:
    """Every figure of ``after`` against ``before``, regressions flagged beyond ``threshold`` (0.10 = 10 %)."""
    if not (isinstance(threshold, int | float) and 0 < threshold < 10):
        raise FrontierError(f"--threshold = {threshold!r}: must be a fraction > 0 and < 10 (0.10 = 10 %)")
    diffs = []
    for name, higher_is_better in FIGURES:
        a, b = float(getattr(before, name)), float(getattr(after, name))
        ratio = b / a if a else (math.inf if b else 1.0)
        worse = ratio < 1 - threshold if higher_is_better else ratio > 1 + threshold
        diffs.append(FigureDiff(name, a, b, higher_is_better, ratio, worse, float(threshold)))
    return diffs
