"""What quantized weights do to decode speed, as measured — never what their bytes promise.

Halving the bytes a decode step streams halves its time only where the GEMM reads the narrow weights
as they are. Ours did not always: on a GPU the int8 path dequantised every weight per call and ran
at a quarter of bf16's speed while its bytes promised twice. So the planner takes each method's
speed from ``quantization_speed.json`` beside this module: per device kind, activation dtype and
method, the quantized engine's decode tokens per second over the unquantized engine's in the same
run and batch, written by ``bench/quantized_weights.py --write-table`` (``--gpu-engine`` on a GPU
host). The worst batch measured is the factor: a method is recommended only where it was never
measured slower. A method with no measurement for a device is not recommended there either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from frontier_runtime.ops.table import QUANTIZATIONS

TABLE = Path(__file__).with_name("quantization_speed.json")


@dataclass(frozen=True)
class Measured:
    device: str  # ops.table's device kind: cpu or cuda
    dtype: str  # the activations' (and the unquantized weights') dtype
    method: str  # model.quantization
    batch: int  # decode sequences at once
    factor: float  # quantized decode tok/s over unquantized, same run
    source: str  # the bench command, the machine, the date


@dataclass(frozen=True)
class Speed:
    """A method's measured decode speed against unquantized weights on one device kind and dtype."""

    factor: float  # the worst batch's
    measured: tuple[Measured, ...]

    @property
    def slower(self) -> bool:
        return self.factor < 1.0

    def describe(self) -> str:
        batches = ", ".join(
            f"batch {m.batch} {m.factor:.2f}x" for m in sorted(self.measured, key=lambda m: m.batch)
        )
        return f"{batches} ({self.measured[0].source})"


def read_table(path: Path = TABLE) -> tuple[Measured, ...]:
    rows = json.loads(path.read_text())["measurements"]
    return tuple(Measured(**row) for row in rows)


@cache
def _committed() -> tuple[Measured, ...]:
    return read_table()


def speed_of(device: str, dtype: str, method: str, table: tuple[Measured, ...] | None = None) -> Speed | None:
    """The measured speed of ``method`` on ``device`` in ``dtype``; None where none was measured."""
    rows = tuple(
        m
        for m in (table if table is not None else _committed())
        if (m.device, m.dtype, m.method) == (device, dtype, method)
    )
    return Speed(min(m.factor for m in rows), rows) if rows else None


def why_not_recommended(
    device: str, dtype: str, method: str, table: tuple[Measured, ...] | None = None
) -> str:
    """Why the planner does not recommend ``method`` here ("" where it may: measured no slower)."""
    if not QUANTIZATIONS[method].quantized:
        return ""
    speed = speed_of(device, dtype, method, table)
    if speed is None:
        return (
            f"quantization: {method} weights not measured on {device} in {dtype} "
            "(bench/quantized_weights.py --write-table)"
        )
    if speed.slower:
        return f"quantization: {method} weights measured slower than {dtype} on {device}"
    return ""
