"""The roofline device of a node group and its default efficiencies: a GPU from the datasheet table,
the CPU of a local stack from the micro-benchmark."""

from __future__ import annotations

import os
from dataclasses import replace

from frontier.capacity.cpu import CpuMeasurement, measured_cpu
from frontier.capacity.gpus import GpuSpec, gpu_spec
from frontier.capacity.roofline import GPU_EFFICIENCY, Device, Efficiency
from frontier.config.schema import DTYPE_BYTES, GB, NodeGroup, PoolSettings, Settings

# The CPU's bandwidth and FLOP/s are measured through the engine's own linear layer (see
# ``frontier.capacity.cpu``), so their efficiencies are 1, and the weights cross memory once per step
# whatever the rows: the engine packs each weight once, at load, and its panel GEMM prefetches the
# weights ahead of the tiles that compute on them, so memory and arithmetic overlap. The engine's own
# time per layer and per sequence is fitted on the engine by the same measurement
# (``cpu_efficiency``); these are the figures of this 2-core machine at one thread, for a CPU
# modelled without measuring.
CPU_EFFICIENCY = Efficiency(
    bandwidth=1.0,
    flops=1.0,
    link=1.0,
    allreduce_latency_s=50e-6,
    step_overhead_s=0.0,
    seq_overhead_s=0.13e-3,
    source="modelled: the engine's linear layer measured (one weight pass per step, memory and compute "
    "overlapped); engine overhead 0.92 ms/layer + 0.13 ms/sequence per step",
    overlap=1.0,
    gemm_weight_passes=1.0,
    layer_overhead_s=0.92e-3,
    expert_gemms="serial",  # SparseMoE.grouped: one GEMM per expert in use, one after another
)


def cpu_efficiency(m: CpuMeasurement) -> Efficiency:
    """CPU_EFFICIENCY with the engine's overhead fitted on this machine."""
    return replace(
        CPU_EFFICIENCY,
        layer_overhead_s=m.layer_overhead_s,
        seq_overhead_s=m.seq_overhead_s,
        request_overhead_s=m.request_overhead_s,
        token_overhead_s=m.token_overhead_s,
        gemm_row_tile=m.gemm_row_tile,
        moe_layer_overhead_s=m.moe_layer_overhead_s,
        expert_overhead_s=m.expert_overhead_s,
        source=f"modelled: the engine's {m.kernel or 'linear'} GEMM measured (one weight pass per step, memory "
        f"and compute overlapped, rows in tiles of {m.gemm_row_tile}); engine overhead fitted on the engine: "
        f"{m.layer_overhead_s * 1e3:.2f} ms/layer + {m.seq_overhead_s * 1e3:.3f} ms/sequence per step, a sparse "
        f"layer {m.moe_layer_overhead_s * 1e3:.3f} ms + {m.expert_overhead_s * 1e3:.3f} ms/expert GEMM; server "
        f"fitted on a runtime process: {m.request_overhead_s * 1e3:.2f} ms/request + "
        f"{m.token_overhead_s * 1e3:.3f} ms/streamed token",
    )


def cpu_threads(pool: PoolSettings) -> int:
    """The intra-op threads one runtime of ``pool`` uses (``runtime.cpu_threads``; 0 = all cores)."""
    return pool.runtime.cpu_threads or os.cpu_count() or 1


def gpu_device(spec: GpuSpec, model_dtype: str) -> Device:
    return Device(
        name=spec.name,
        memory_bytes=spec.memory_gb * GB,
        bandwidth=spec.bandwidth,
        flops=spec.flops_for(DTYPE_BYTES[model_dtype]),
        link_bandwidth=spec.link_bandwidth,
        source=f"datasheet: {spec.source}",
    )


def cpu_device(threads: int, memory_bytes: float, *, refresh: bool = False) -> tuple[Device, Efficiency]:
    """This machine's CPU at ``threads`` intra-op threads, as the micro-benchmark measured it."""
    m, cached = measured_cpu(threads, refresh=refresh)
    when = f"cached from {m.measured_at}" if cached else "just now"
    device = Device(
        name=f"CPU, {threads} thread(s)",
        memory_bytes=memory_bytes,
        bandwidth=m.bandwidth,
        flops=m.flops,
        # Tensor-parallel ranks on one CPU exchange activations through shared memory.
        link_bandwidth=m.bandwidth,
        source=f"measured on this machine ({m.machine}; {when}) through the engine's {m.kernel} GEMM: "
        f"weights streamed at {m.bandwidth / 1e9:.1f} GB/s, {m.flops / 1e9:.1f} GFLOP/s at many rows, "
        f"timed by {m.clock}",
    )
    return device, cpu_efficiency(m)


def device_for(
    settings: Settings, pool: PoolSettings, *, refresh_cpu: bool = False
) -> tuple[Device, Efficiency]:
    """The device of ``pool``'s node group and the efficiencies to start from."""
    group: NodeGroup = pool.group
    if group.accelerator == "cpu":
        return cpu_device(cpu_threads(pool), group.gpu_memory_gb * GB, refresh=refresh_cpu)
    index = next(i for i, declared in enumerate(settings.node_groups) if declared.name == group.name)
    spec = gpu_spec(group.gpu_type, f"node_groups[{index}].gpu_type")
    return gpu_device(spec, pool.model.dtype), GPU_EFFICIENCY
