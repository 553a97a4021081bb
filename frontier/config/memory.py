"""GPU memory of a serving replica: weights, KV cache per token and what fits.

The stack checks refuse at load time a model that does not fit its node group, so this arithmetic
sits with the settings, below the capacity planner that builds on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frontier_runtime.ops.table import QUANTIZATIONS

from frontier.config.schema import DTYPE_BYTES, GB, Model, NodeGroup, PoolSettings


@dataclass(frozen=True)
class MemoryFit:
    """Memory of one GPU (one device on CPU stacks) for a serving replica, in bytes."""

    gpu_memory_bytes: float
    utilization: float
    weights_bytes: float
    weights_per_gpu_bytes: float
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_tokens_required: int
    kv_required_bytes: float
    reserved_bytes: float

    @property
    def budget_bytes(self) -> float:
        return self.utilization * self.gpu_memory_bytes

    @property
    def used_bytes(self) -> float:
        return self.weights_per_gpu_bytes + self.kv_required_bytes + self.reserved_bytes

    @property
    def fits(self) -> bool:
        return self.used_bytes <= self.budget_bytes

    @property
    def kv_capacity_bytes(self) -> float:
        return max(0.0, self.budget_bytes - self.weights_per_gpu_bytes - self.reserved_bytes)

    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.kv_capacity_bytes // self.kv_bytes_per_token_per_gpu)

    @property
    def headroom_bytes(self) -> float:
        return self.budget_bytes - self.used_bytes

    def explain(self) -> str:
        return (
            f"weights/GPU {self.weights_per_gpu_bytes / GB:.2f} GB + KV cache {self.kv_required_bytes / GB:.2f} GB "
            f"({self.kv_tokens_required} tokens x {self.kv_bytes_per_token_per_gpu} B/token/GPU) + reserved "
            f"{self.reserved_bytes / GB:.2f} GB = {self.used_bytes / GB:.2f} GB > budget "
            f"{self.budget_bytes / GB:.2f} GB (gpu_memory_utilization {self.utilization} x "
            f"{self.gpu_memory_bytes / GB:.0f} GB)"
        )


# model.quantization: a quantized projection holds its method's bytes per weight (one for int8 and
# float8_e4m3fn) and a float32 scale per output channel; the embedding, norms, LM head and router
# keep model.dtype.
SCALE_BYTES = 4


def projection_parameters(model: Model) -> tuple[int, int]:
    """Weights and output channels of the linear projections (q/k/v/o, gate/up/down of every expert)."""
    h, kv = model.hidden_size, model.num_kv_heads * model.head_dim
    width, experts = model.expert_intermediate_size, max(1, model.num_experts)
    weights = 2 * h * h + 2 * h * kv + 3 * h * width * experts
    channels = 2 * h + 2 * kv + (2 * width + h) * experts
    return model.num_layers * weights, model.num_layers * channels


def projection_bytes_per_parameter(model: Model) -> float:
    """Bytes a projection's weight takes per parameter: model.dtype's, or the quantized byte and its
    share of the per-channel scales."""
    method = QUANTIZATIONS[model.quantization]
    if not method.quantized:
        return DTYPE_BYTES[model.dtype]
    weights, channels = projection_parameters(model)
    return method.weight_bytes + SCALE_BYTES * channels / weights


def weights_bytes(model: Model) -> float:
    """The whole model's weights: the projections as quantized, everything else in model.dtype."""
    projections, _ = projection_parameters(model)
    rest = model.num_parameters - projections
    return rest * DTYPE_BYTES[model.dtype] + projections * projection_bytes_per_parameter(model)


def kv_cache_dtype_bytes(pool: PoolSettings) -> int:
    dtype = pool.runtime.kv_cache_dtype
    return DTYPE_BYTES[pool.model.dtype if dtype == "auto" else dtype]


def kv_bytes_per_token(
    model: Model, dtype_bytes: int, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per element — per GPU when sharded.

    KV heads shard across tensor-parallel ranks (replicated when TP exceeds them); layers shard
    across pipeline stages.
    """
    heads = max(1, model.num_kv_heads // tensor_parallel)
    layers = math.ceil(model.num_layers / pipeline_parallel)
    return 2 * layers * heads * model.head_dim * dtype_bytes


def memory_fit(pool: PoolSettings, group: NodeGroup) -> MemoryFit:
    """One GPU of ``group`` serving ``pool``'s model with its runtime (the planner asks of other groups)."""
    rt, model = pool.runtime, pool.model
    shards = rt.tensor_parallel_size * rt.pipeline_parallel_size
    weights = weights_bytes(model)
    dtype_bytes = kv_cache_dtype_bytes(pool)
    tokens = rt.batch.max_batch_size * model.max_seq_len
    per_gpu = kv_bytes_per_token(model, dtype_bytes, rt.tensor_parallel_size, rt.pipeline_parallel_size)
    return MemoryFit(
        gpu_memory_bytes=group.gpu_memory_gb * GB,
        utilization=rt.gpu_memory_utilization,
        weights_bytes=weights,
        weights_per_gpu_bytes=weights / shards,
        kv_bytes_per_token=kv_bytes_per_token(model, dtype_bytes),
        kv_bytes_per_token_per_gpu=per_gpu,
        kv_tokens_required=tokens,
        kv_required_bytes=tokens * per_gpu,
        reserved_bytes=rt.reserved_memory_gb * GB,
    )
