"""Fit the roofline to a measured baseline: the engine-overhead terms, scaled until the modelled
knee equals the measured one.

A baseline is one figure (requests/s per replica at the knee), so one parameter is fitted: a scale
on the per-step and per-sequence overheads. Those are the software part of a step — the peaks and
their efficiencies are physics, the engine's own time is what a datasheet cannot know. When even
zero overhead is slower than the measurement, nothing is fitted and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier.capacity.baseline import Baseline
from frontier.capacity.roofline import Device, Efficiency, Replica, fit_slo
from frontier.config.schema import Slo

MAX_SCALE = 1e4
ITERATIONS = 60


@dataclass(frozen=True)
class Calibration:
    baseline: Baseline
    fitted: bool
    overhead_scale: float  # 1 = the defaults; the fitted efficiency's overheads are the defaults x this
    modelled_qps: float  # the knee with the default efficiencies
    calibrated_qps: float  # the knee after the fit
    note: str


def knee_qps(device: Device, eff: Efficiency, replica: Replica, slo: Slo, prompt: int, output: int) -> float:
    """Requests/s of one replica at the largest concurrency meeting every SLO (0 when none does)."""
    best = fit_slo(device, eff, replica, slo, prompt, output).best
    return best.requests_per_s if best is not None else 0.0


def calibrate(
    device: Device,
    eff: Efficiency,
    replica: Replica,
    slo: Slo,
    prompt: int,
    output: int,
    baseline: Baseline,
) -> tuple[Efficiency, Calibration]:
    target = baseline.replica_qps

    def knee(k: float) -> float:
        return knee_qps(device, eff.with_overhead_scale(k, eff.source), replica, slo, prompt, output)

    modelled = knee(1.0)
    if knee(0.0) < target:
        note = (
            f"not fitted: the measured knee ({target:g} req/s) beats the roofline even with no engine "
            f"overhead ({knee(0.0):,.2f} req/s); the device peaks or efficiencies are too low"
        )
        return eff, Calibration(baseline, False, 1.0, modelled, modelled, note)
    lo, hi = 0.0, 1.0
    while knee(hi) > target and hi < MAX_SCALE:
        lo, hi = hi, hi * 2
    for _ in range(ITERATIONS):  # knee(k) falls as k grows: keep knee(lo) >= target > knee(hi)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if knee(mid) >= target else (lo, mid)
    fitted = eff.with_overhead_scale(
        lo,
        f"calibrated: engine overhead x {lo:.3g} fitted to the measured knee of {baseline.measured_at} "
        f"({target:g} req/s per replica); peaks and their efficiencies as modelled",
    )
    note = (
        f"overhead {fitted.step_overhead_s * 1e3:.2f} ms/step + {fitted.layer_overhead_s * 1e3:.3f} ms/layer + "
        f"{fitted.seq_overhead_s * 1e3:.3f} ms/sequence "
        f"(x {lo:.3g} of the defaults): modelled knee {modelled:,.2f} -> {knee(lo):,.2f} req/s, measured {target:g}"
    )
    return fitted, Calibration(baseline, True, lo, modelled, knee(lo), note)
