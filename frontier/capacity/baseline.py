"""A stack's measured capacity baseline: what one replica sustains at the knee of a load test.

The load test writes it (``stacks/baselines/<stack>.json``, pretty JSON, kept in git beside the stack
it describes); the planner reads it in place of ``capacity.assumed_replica_qps``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from frontier.errors import FrontierError
from frontier.project import stacks_dir


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


def load_baseline(stack: str) -> Baseline | None:
    """The stack's baseline, or None when none was measured yet. A damaged file is an error."""
    path = baseline_path(stack)
    if not path.exists():
        return None
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
    """Write the baseline atomically and return its path."""
    path = baseline_path(baseline.stack)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(baseline), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
