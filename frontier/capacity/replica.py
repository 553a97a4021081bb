"""The roofline of a stack's serving replica: its device, efficiencies (calibrated where a baseline
was measured), its curve over concurrency, the best point under the SLOs, and what the planner sizes
the fleet from."""

from __future__ import annotations

from dataclasses import dataclass

from frontier.capacity.baseline import Baseline
from frontier.capacity.calibrate import Calibration, calibrate
from frontier.capacity.devices import device_for
from frontier.capacity.plan import Throughput
from frontier.capacity.roofline import Device, Efficiency, Replica, SloFit, fit_slo
from frontier.config.schema import PoolSettings, Settings


@dataclass(frozen=True)
class ReplicaModel:
    stack: str
    device: Device
    efficiency: Efficiency
    replica: Replica
    prompt: int
    output: int
    fit: SloFit
    calibration: Calibration | None

    def throughput(self) -> Throughput | None:
        """The planner's per-replica figures at the best SLO point; None when no concurrency meets the SLOs."""
        best = self.fit.best
        if best is None:
            return None
        return Throughput(
            replica_qps=best.requests_per_s,
            output_tokens_per_s=best.output_tokens_per_s,
            source="roofline",
            baseline=None,
            detail=(
                f"concurrency {best.concurrency} (batch {best.batch}), TTFT {best.ttft_s * 1e3:,.0f} ms, "
                f"TPOT {best.tpot_s * 1e3:,.1f} ms, {self.prompt} prompt + {self.output} output tokens; "
                f"{self.device.name}; {self.efficiency.source}"
            ),
        )


def model_stack(
    settings: Settings, pool: PoolSettings, baseline: Baseline | None, *, refresh_cpu: bool = False
) -> ReplicaModel:
    """A replica of ``pool`` on its node group, calibrated to ``baseline`` when given."""
    device, eff = device_for(settings, pool, refresh_cpu=refresh_cpu)
    replica = Replica.from_pool(pool)
    cap, slo = settings.capacity, settings.slo
    calibration = None
    if baseline is not None:
        eff, calibration = calibrate(
            device, eff, replica, slo, cap.avg_prompt_tokens, cap.avg_output_tokens, baseline
        )
    fit = fit_slo(device, eff, replica, slo, cap.avg_prompt_tokens, cap.avg_output_tokens)
    return ReplicaModel(
        stack=settings.stack,
        device=device,
        efficiency=eff,
        replica=replica,
        prompt=cap.avg_prompt_tokens,
        output=cap.avg_output_tokens,
        fit=fit,
        calibration=calibration,
    )
