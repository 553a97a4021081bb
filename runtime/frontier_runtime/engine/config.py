"""The engine's settings: one frozen ``EngineConfig``, built once at start and handed to every part
(scheduler, block manager, model runner, the other tensor-parallel ranks).

It inherits the engine's part of the runtime's settings (batching, KV cache, parallelism, CPU
threads) from :mod:`frontier_runtime.config`, so each of those fields has its one declaration,
default and range there; only what no stack sets (the kernels, a fixed block count) is declared here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from pydantic import model_validator

from frontier_runtime.config import (
    AttentionBackend,
    BatchConfig,
    CacheConfig,
    CpuConfig,
    Dtype,
    KvCacheDtype,
    ModelConfig,
    ParallelConfig,
    Quantization,
    RuntimeConfig,
)
from frontier_runtime.models.llama.quant import device_problem

DTYPE_NAMES: tuple[str, ...] = get_args(Dtype)
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KvCacheDtype)
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)


class EngineConfig(BatchConfig, CacheConfig, ParallelConfig, CpuConfig):
    model_dir: Path
    # "auto": the checkpoint's own dtype (config.json's torch_dtype).
    dtype: Literal[Dtype, "auto"] = ModelConfig.model_fields["dtype"].default
    quantization: Quantization = ModelConfig.model_fields["quantization"].default
    # "cpu", "cuda", or "auto", resolved to one of them when the config is built.
    device: str = RuntimeConfig.model_fields["device"].default
    max_seq_len: int | None = None  # None: the model's max_position_embeddings
    seed: int = RuntimeConfig.model_fields["seed"].default
    num_blocks: int | None = None  # None: as many KV blocks as the memory budget holds
    cuda_graphs: bool = True  # decode steps replay captured graphs (CUDA; backends that read tensors only)

    def __init__(self, model_dir: str | Path | None = None, /, **settings: Any) -> None:
        """``EngineConfig(model_dir, max_batch_size=8, ...)``: the directory may come first."""
        if model_dir is not None:
            settings["model_dir"] = model_dir
        super().__init__(**settings)

    @model_validator(mode="after")
    def _resolve_device(self) -> EngineConfig:
        device = resolve_device(self.device)
        object.__setattr__(self, "device", device)  # frozen: normalised once, here
        if device == "cuda" and self.dtype == "float32":
            raise ValueError(
                "model.dtype 'float32' is refused on CUDA: it halves throughput and doubles memory for "
                "no gain in serving quality, and the paged flash kernels take only bfloat16/float16; "
                "use 'bfloat16', 'float16' or 'auto' (the checkpoint's dtype)"
            )
        problem = device_problem(self.quantization, device)  # refused at start, before any weight is read
        if problem:
            raise ValueError(problem)
        return self

    def updated(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes``, validated like a new one."""
        return EngineConfig(**{**dict(self), **changes})

    @classmethod
    def from_runtime(cls, config: RuntimeConfig, model_dir: str | Path) -> EngineConfig:
        """The engine's part of the rendered runtime.yaml: the inherited sections field for field."""
        inherited = {name: getattr(config, name) for name in _FLAT_SECTIONS}
        return cls(
            model_dir,
            **config.batch.model_dump(),
            **inherited,
            dtype=config.model.dtype,
            quantization=config.model.quantization,
            device=config.device,
            max_seq_len=config.model.max_seq_len,
            seed=config.seed,
        )

    @property
    def threads_per_rank(self) -> int:
        """Intra-op threads of each rank (tensor, expert or pipeline parallel): this node's budget split
        evenly over this node's ranks, at least one.

        Oversubscribed threads make every step several times slower, so ranks share the budget
        (all cores when ``cpu_threads`` is 0) rather than each taking all of it.
        """
        budget = self.cpu_threads or os.cpu_count() or 1
        return max(1, budget // self.ranks_per_node)


# The sections RuntimeSettings and EngineConfig both inherit, whose fields sit at the top level of each.
_FLAT_SECTIONS = (*CacheConfig.model_fields, *ParallelConfig.model_fields, *CpuConfig.model_fields)


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
