"""The engine's settings: one frozen ``EngineConfig``, built once at start and handed to every part
(scheduler, block manager, model runner, the other tensor-parallel ranks)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from frontier_runtime.config import RuntimeConfig

DTYPE_NAMES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    dtype: str = "float32"
    device: str = "cpu"  # "cpu", "cuda", or "auto" (resolved to one of them when the config is built)
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    # Scheduling.
    max_batch_size: int = 16
    max_num_batched_tokens: int = 1024
    chunked_prefill: bool = True
    batch_window_ms: float = 0.0  # AsyncEngine: how long an idle engine waits for companions
    # KV cache.
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    cpu_kv_cache_bytes: int = 256 * 1024 * 1024
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None  # None: as many as the budget above holds
    prefix_caching: bool = True
    # Parallelism and CPU.
    tensor_parallel_size: int = 1
    cpu_threads: int = 0  # intra-op threads of the whole engine, split over its ranks; 0: all cores
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {sorted(DTYPE_NAMES)}")
        if self.kv_cache_dtype not in ("auto", *DTYPE_NAMES):
            raise ValueError(
                f"cache.kv_cache_dtype {self.kv_cache_dtype!r} is not supported by this runtime "
                f"(auto, {', '.join(sorted(DTYPE_NAMES))})"
            )
        # Frozen, so the two normalisations below go through object.__setattr__.
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        object.__setattr__(self, "device", resolve_device(self.device))

    @classmethod
    def from_runtime(cls, config: RuntimeConfig, model_dir: str | Path) -> EngineConfig:
        """The engine's part of the rendered runtime.yaml."""
        s, c, par = config.scheduler, config.cache, config.parallel
        for name, value in (
            ("pipeline_parallel_size", par.pipeline_parallel_size),
            ("expert_parallel_size", par.expert_parallel_size),
        ):
            if value != 1:
                raise ValueError(
                    f"parallel.{name} = {value}: this runtime supports only 1 (tensor parallelism only)"
                )
        return cls(
            model_dir=Path(model_dir),
            dtype=config.model.dtype,
            device=config.device,
            max_seq_len=config.model.max_seq_len,
            max_batch_size=s.max_batch_size,
            max_num_batched_tokens=s.max_num_batched_tokens,
            chunked_prefill=s.chunked_prefill,
            batch_window_ms=s.batch_window_ms,
            block_size=c.block_size,
            kv_cache_dtype=c.kv_cache_dtype,
            cpu_kv_cache_bytes=c.cpu_kv_cache_bytes,
            gpu_memory_utilization=c.gpu_memory_utilization,
            prefix_caching=c.prefix_caching,
            tensor_parallel_size=par.tensor_parallel_size,
            cpu_threads=config.cpu_threads,
            seed=config.seed,
        )

    @property
    def threads_per_rank(self) -> int:
        """Intra-op threads of each tensor-parallel rank: the budget split evenly, at least one.

        Oversubscribed threads make every step several times slower, so ranks share the budget
        (all cores when ``cpu_threads`` is 0) rather than each taking all of it.
        """
        budget = self.cpu_threads or os.cpu_count() or 1
        return max(1, budget // self.tensor_parallel_size)


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but no CUDA device is available (use 'cpu' or 'auto')")
    return device
