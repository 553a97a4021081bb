"""The roofline device of a node group and its default efficiencies: a GPU from the datasheet table,
the CPU of a local stack from the micro-benchmark."""

from __future__ import annotations

import os

from frontier.capacity.cpu import measured_cpu
from frontier.capacity.gpus import GpuSpec, gpu_spec
from frontier.capacity.roofline import GPU_EFFICIENCY, Device, Efficiency
from frontier.config.schema import DTYPE_BYTES, GB, NodeGroup, Settings

# The CPU's bandwidth and FLOP/s are measured, so their efficiencies are 1. One core does not overlap
# memory traffic with arithmetic (overlap 0), and torch's CPU BLAS packs each weight matrix before a
# GEMM of more than one row (weights read, written packed, read again: 3 passes); both show in a
# micro-benchmark of the runtime's own layer shapes (a 768-wide, 100M-parameter stack of [in, out]
# weights on this 2-core machine, one thread: 23 ms at 1 row, 95 ms at 8, 168 ms at 32 — the
# model gives 28, 99 and 167). The engine's own time per step (Python: each layer's ops dispatched
# one by one, then per sequence scheduling, sampling, detokenising) was fitted with the tiny model
# (4 layers) at concurrency 1 and 32, timed by thread CPU time: 0.92 ms per layer + 0.13 ms per
# sequence (`bench/roofline_vs_measured.py` prints the fit; a fit with a fixed term as well, on the
# 100M model too, put that term at or below zero). Calibration against a stack's baseline refits it.
CPU_EFFICIENCY = Efficiency(
    bandwidth=1.0,
    flops=1.0,
    link=1.0,
    allreduce_latency_s=50e-6,
    step_overhead_s=0.0,
    seq_overhead_s=0.13e-3,
    source="modelled: measured CPU peaks, no overlap, 3 weight passes per GEMM; engine overhead 0.92 ms/layer "
    "+ 0.13 ms/sequence per step (fitted on the tiny model)",
    overlap=0.0,
    gemm_weight_passes=3.0,
    layer_overhead_s=0.92e-3,
)


def cpu_threads(settings: Settings) -> int:
    """The intra-op threads one runtime of the stack uses (``runtime.cpu_threads``; 0 = all cores)."""
    return settings.runtime.cpu_threads or os.cpu_count() or 1


def gpu_device(spec: GpuSpec, model_dtype: str) -> Device:
    return Device(
        name=spec.name,
        memory_bytes=spec.memory_gb * GB,
        bandwidth=spec.bandwidth,
        flops=spec.flops_for(DTYPE_BYTES[model_dtype]),
        link_bandwidth=spec.link_bandwidth,
        source=f"datasheet: {spec.source}",
    )


def device_for(settings: Settings, index: int = 0, *, refresh_cpu: bool = False) -> tuple[Device, Efficiency]:
    """The device of ``node_groups[index]`` and the efficiencies to start from."""
    group: NodeGroup = settings.node_groups[index]
    if group.accelerator == "cpu":
        threads = cpu_threads(settings)
        m, cached = measured_cpu(threads, refresh=refresh_cpu)
        when = f"cached from {m.measured_at}" if cached else "just now"
        device = Device(
            name=f"CPU, {threads} thread(s)",
            memory_bytes=group.gpu_memory_gb * GB,
            bandwidth=m.bandwidth,
            flops=m.flops,
            # Tensor-parallel ranks on one CPU exchange activations through shared memory.
            link_bandwidth=m.bandwidth,
            source=f"measured on this machine ({m.machine}; {when}): copy {m.bandwidth / 1e9:.1f} GB/s, "
            f"matmul {m.flops / 1e9:.1f} GFLOP/s, timed by {m.clock}",
        )
        return device, CPU_EFFICIENCY
    spec = gpu_spec(group.gpu_type, f"node_groups[{index}].gpu_type")
    return gpu_device(spec, settings.model.dtype), GPU_EFFICIENCY
