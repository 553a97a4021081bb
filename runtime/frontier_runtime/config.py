"""The runtime's typed configuration, read from the rendered ``runtime.yaml``.

This model is the contract between the toolkit (which renders the file per stack) and the
runtime (which reads it at start). The toolkit validates every rendered file against it, so a
setting the runtime would refuse never reaches a host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from frontier_runtime.contracts import DEFAULT_LIVENESS_PATH, DEFAULT_READINESS_PATH

Dtype = Literal["float32", "bfloat16", "float16"]
KvCacheDtype = Literal["auto", "float32", "bfloat16", "float16", "fp8"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    name: str = Field(min_length=1, description="Model id served under /v1/models.")
    source: str = Field(
        min_length=1,
        description="s3://bucket/prefix (with a manifest.json written by weights.push) or a local directory.",
    )
    version: str = Field(default="", description="Weights version; part of the cache key.")
    dtype: Dtype = "float32"
    max_seq_len: int = Field(ge=16, le=1_048_576)


class ServerConfig(_Strict):
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=1, le=65535)
    api_keys_secret_id: str | None = Field(
        default=None, description="Secrets Manager id holding API keys; None disables auth."
    )
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    keepalive_s: float = Field(default=15.0, gt=0, le=600, description="SSE comment keep-alive interval.")


class HealthConfig(_Strict):
    readiness_path: str = Field(default=DEFAULT_READINESS_PATH, pattern=r"^/[A-Za-z0-9_./-]*$")
    liveness_path: str = Field(default=DEFAULT_LIVENESS_PATH, pattern=r"^/[A-Za-z0-9_./-]*$")
    stuck_after_s: float = Field(
        default=30.0, gt=0, le=3600, description="Engine loop silent this long = not live."
    )


class SchedulerConfig(_Strict):
    max_concurrency: int = Field(ge=1, le=65536, description="Requests admitted into the engine at once.")
    queue_max_length: int = Field(
        ge=0, le=1_000_000, description="Requests waiting for admission; beyond: 429."
    )
    queue_timeout_ms: int = Field(ge=1, le=3_600_000, description="Longest wait for admission; beyond: 503.")
    # Batch-priority requests wait in their own queue (None: the same bounds as interactive ones).
    batch_queue_max_length: int | None = Field(
        default=None, ge=0, le=1_000_000, description="Batch requests waiting for admission; beyond: 429."
    )
    batch_queue_timeout_ms: int | None = Field(
        default=None,
        ge=1,
        le=86_400_000,
        description="Longest wait of a batch request for admission; beyond: 503.",
    )
    batch_window_ms: float = Field(ge=0, le=1000, description="Wait for companions while the engine is idle.")
    max_batch_size: int = Field(ge=1, le=4096, description="Sequences per engine step.")
    max_num_batched_tokens: int = Field(ge=16, le=1_048_576, description="Tokens per engine step.")
    chunked_prefill: bool = True

    @model_validator(mode="after")
    def _batch_within_concurrency(self) -> SchedulerConfig:
        if self.max_batch_size > self.max_concurrency:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) must be <= max_concurrency ({self.max_concurrency})"
            )
        return self


class CacheConfig(_Strict):
    block_size: int = Field(default=16, ge=1, le=256)
    kv_cache_dtype: KvCacheDtype = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=0.98)
    cpu_kv_cache_bytes: int = Field(default=256 * 1024 * 1024, ge=1024, description="KV budget on CPU.")
    prefix_caching: bool = True
    weights_cache_dir: str = "/var/cache/frontier/weights"


class ParallelConfig(_Strict):
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    expert_parallel_size: int = Field(default=1, ge=1, le=1024)


class DrainConfig(_Strict):
    timeout_s: float = Field(default=30.0, ge=0, le=3600)


class LoggingConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_logs: bool = True


class RuntimeConfig(_Strict):
    model: ModelConfig
    server: ServerConfig = ServerConfig()
    health: HealthConfig = HealthConfig()
    scheduler: SchedulerConfig
    cache: CacheConfig = CacheConfig()
    parallel: ParallelConfig = ParallelConfig()
    drain: DrainConfig = DrainConfig()
    logging: LoggingConfig = LoggingConfig()
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cpu_threads: int = Field(
        default=0, ge=0, le=1024, description="Intra-op threads on CPU; 0 keeps torch's default (all cores)."
    )
    cpu_bind_threads: bool = Field(
        default=False, description="Pin each intra-op thread to a core of its own (one runtime per host)."
    )
    seed: int = 0


class ConfigError(ValueError):
    """A runtime.yaml that the runtime refuses; the message names the file, field and value."""


def parse_config(text: str, source: str = "runtime.yaml") -> RuntimeConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return RuntimeConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "(root)"
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" = {value!r}"
            lines.append(f"{source}: {path}{shown}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def load_config(path: str | Path) -> RuntimeConfig:
    path = Path(path)
    return parse_config(path.read_text(), source=str(path))
