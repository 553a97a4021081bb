"""The engine's settings: one frozen ``EngineConfig``, built once at start and handed to every part
(scheduler, block manager, model runner, the other tensor-parallel ranks)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the engine itself runs without pydantic (bench/gpu_check.py imports only this path)
    from frontier_runtime.config import RuntimeConfig

DTYPE_NAMES = ("bfloat16", "float16", "float32")
KV_CACHE_DTYPES = ("auto", *DTYPE_NAMES, "fp8")
ATTENTION_BACKENDS = ("auto", "cpu-kernel", "flash-varlen", "sdpa-gather")


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    dtype: str = "float32"  # or "auto": the checkpoint's own (config.json torch_dtype)
    device: str = "cpu"  # "cpu", "cuda", or "auto" (resolved to one of them when the config is built)
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    # Scheduling.
    max_batch_size: int = 16
    max_num_batched_tokens: int = 1024
    chunked_prefill: bool = True
    batch_window_ms: float = 0.0  # AsyncEngine: how long an idle engine waits for companions
    # KV cache.
    block_size: int = 16
    kv_cache_dtype: str = "auto"  # "fp8": e4m3 with a per-layer scale, half the bytes of bf16
    cpu_kv_cache_bytes: int = 256 * 1024 * 1024
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None  # None: as many as the budget above holds
    prefix_caching: bool = True
    # Parallelism and CPU.
    tensor_parallel_size: int = 1
    cpu_threads: int = 0  # intra-op threads of the whole engine, split over its ranks; 0: all cores
    cpu_bind_threads: bool = False  # pin each intra-op thread to a core of its own (engine.affinity)
    seed: int = 0
    # Kernels.
    attention_backend: str = "auto"  # see ops.paged_attention; "auto" picks the fastest that works
    cuda_graphs: bool = True  # decode steps replay captured graphs (CUDA, paged flash kernel)

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", *DTYPE_NAMES):
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {['auto', *sorted(DTYPE_NAMES)]}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"cache.kv_cache_dtype {self.kv_cache_dtype!r} is not supported by this runtime "
                f"({', '.join(KV_CACHE_DTYPES)})"
            )
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend {self.attention_backend!r} is not one of {', '.join(ATTENTION_BACKENDS)}"
            )
        # Frozen, so the normalisations below go through object.__setattr__.
        object.__setattr__(self, "model_dir", Path(self.model_dir))
        object.__setattr__(self, "device", resolve_device(self.device))
        if self.device == "cuda" and self.dtype == "float32":
            raise ValueError(
                "model.dtype 'float32' is refused on CUDA: it halves throughput and doubles memory for "
                "no gain in serving quality, and the paged flash kernels take only bfloat16/float16; "
                "use 'bfloat16', 'float16' or 'auto' (the checkpoint's dtype)"
            )

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
            cpu_bind_threads=config.cpu_bind_threads,
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


def checkpoint_dtype(model_dir: Path) -> str:
    """The dtype a checkpoint's config.json declares (``dtype`` or ``torch_dtype``); float32 if none."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").removeprefix("torch.")
    return {"float": "float32", "half": "float16", "bfloat": "bfloat16"}.get(name, name)


def resolve_dtype(config: EngineConfig) -> str:
    """The model dtype to run: the configured one, or for "auto" the checkpoint's own, except that
    a float32 checkpoint runs in bfloat16 on CUDA (float32 is refused there)."""
    if config.dtype != "auto":
        return config.dtype
    name = checkpoint_dtype(config.model_dir)
    if name not in DTYPE_NAMES:
        raise ValueError(
            f"model.dtype 'auto': {config.model_dir}/config.json declares dtype {name!r}, "
            f"not one of {sorted(DTYPE_NAMES)}"
        )
    if name == "float32" and config.device == "cuda":
        return "bfloat16"
    return name


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but no CUDA device is available (use 'cpu' or 'auto')")
    return device
