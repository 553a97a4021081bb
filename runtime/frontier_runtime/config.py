"""The runtime's typed settings: one model that is both the stack's ``runtime:`` section and, with the
model and health sections beside it, the ``runtime.yaml`` the runtime reads at start.

Every setting is declared here once, with its one default and its one range; the toolkit imports
these models as the schema of its stack files (it never mirrors them), renders ``runtime.yaml`` from a
validated :class:`RuntimeConfig`, and the engine's :class:`~frontier_runtime.engine.config.EngineConfig`
inherits the engine's part (:class:`BatchConfig`, :class:`CacheConfig`, :class:`ParallelConfig`,
:class:`CpuConfig`). Rules that span fields sit next to the fields they relate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from frontier_hostside.names import (
    CLOUD_WEIGHTS_CACHE,
    KV_EVENTS_PORT,
    KV_EVENTS_REPLAY_PORT,
    KV_EVENTS_TOPIC,
)
from frontier_hostside.names import LIVENESS_PATH as DEFAULT_LIVENESS_PATH
from frontier_hostside.names import READINESS_PATH as DEFAULT_READINESS_PATH
from frontier_settings import ConfigError, FieldProblem, FieldProblems, load_model, parse_model
from frontier_settings.tracing import TracingSettings
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ConfigError", "RuntimeConfig", "RuntimeSettings", "load_config", "parse_config"]

Dtype = Literal["float32", "bfloat16", "float16"]
KvCacheDtype = Literal["auto", "float32", "bfloat16", "float16", "fp8"]
# Weights of the linear projections: int8 weight-only (CPU and CUDA) or float8_e4m3fn (CUDA only).
Quantization = Literal["none", "int8", "fp8"]
Device = Literal["auto", "cpu", "cuda"]
# How a step's queries read the paged KV cache: a backend registered in frontier_runtime.ops.attention.
AttentionBackend = Literal["auto", "cpu-kernel", "flash-varlen", "triton", "sdpa-gather"]
PATH_PATTERN = r"^/[A-Za-z0-9_./-]*$"
SECRET_ID_PATTERN = r"^[A-Za-z0-9/_+=.@:-]+$"


#: Parallel GETs of a cold start's weights fetch. S3 serves one connection at up to about 100 MB/s,
#: so a host reaches its NIC's rate only with many connections at once; the bound keeps memory at
#: about concurrency x the largest part (a part waits in memory only until its file's hash reaches it).
WEIGHTS_FETCH_CONCURRENCY = 8
WEIGHTS_FETCH_MAX_CONCURRENCY = 64
#: The host's prepared-weights entries together (storage/prepared_eviction.py): a new runtime build
#: or engine setting prepares a new entry, one model's worth each. 100 GiB keeps the entry in use and
#: the one before it (what a rollback maps) for models up to about 25B parameters in bfloat16; with a
#: larger model only the entry in use stays, and a rollback fetches its entry from S3 again.
PREPARED_CACHE_MAX_BYTES = 100 * 1024**3
# The prefill replica's KV transfer listener (vLLM's NIXL side channel listens on 5600).
KV_TRANSFER_PORT = 5600


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Strict):
    """The model a runtime serves: the runtime's part of the stack's ``model:`` section."""

    name: str = Field(min_length=1, description="Model id served under /v1/models.")
    aliases: tuple[str, ...] = Field(
        default=(),
        description="Other names requests may give this model, answered under the name they gave: "
        "an offline pool's runtimes answer to the name of the pool whose batch work they take.",
    )
    weights_uri: str = Field(
        min_length=1,
        description="s3://bucket/prefix (with a manifest.json written by weights.push) or a local directory.",
    )
    version: str = Field(default="", description="Weights version; part of the cache key.")
    dtype: Dtype = "float32"
    quantization: Quantization = Field(
        default="none",
        description=(
            "Weights of the linear projections (attention, MLP, experts): 'int8' weight-only with a "
            "symmetric scale per output channel (CPU and CUDA), 'fp8' float8_e4m3fn with per-channel "
            "scales (CUDA only); embeddings, norms and the LM head stay in dtype. Quantized at load from "
            "a 16/32-bit checkpoint, or read from a compressed-tensors checkpoint of the same scheme."
        ),
    )
    max_seq_len: int = Field(ge=16, le=1_048_576, description="Longest prompt + completion, in tokens.")

    @model_validator(mode="after")
    def _aliases_are_other_names(self) -> ModelConfig:
        if any(not alias for alias in self.aliases) or len(set(self.aliases)) != len(self.aliases):
            raise FieldProblems(
                FieldProblem("aliases", list(self.aliases), "must be distinct, non-empty names")
            )
        if self.name in self.aliases:
            raise FieldProblems(
                FieldProblem("aliases", list(self.aliases), f"must not repeat name ({self.name!r})")
            )
        return self


class HealthConfig(Strict):
    """The probe paths the runtime answers on and the balancer, the agent and the gateway ask."""

    readiness_path: str = Field(default=DEFAULT_READINESS_PATH, pattern=PATH_PATTERN)
    liveness_path: str = Field(default=DEFAULT_LIVENESS_PATH, pattern=PATH_PATTERN)
    stuck_after_s: float = Field(
        default=30.0, gt=0, le=3600, description="Engine loop silent this long = not live."
    )


class QueueConfig(Strict):
    """Requests waiting for admission into the engine."""

    max_length: int = Field(default=64, ge=0, le=1_000_000, description="Beyond this many waiting: 429.")
    timeout_ms: int = Field(default=30_000, ge=1, le=3_600_000, description="Longest wait; beyond: 503.")
    # Batch-priority requests wait in their own queue (None: the same bounds as interactive ones).
    batch_max_length: int | None = Field(default=None, ge=0, le=1_000_000)
    batch_timeout_ms: int | None = Field(default=None, ge=1, le=86_400_000)


class BatchConfig(Strict):
    """What one engine step may hold."""

    window_ms: float = Field(
        default=0.0, ge=0, le=1000, description="How long an idle engine waits for companions."
    )
    max_batch_size: int = Field(default=16, ge=1, le=4096, description="Sequences per engine step.")
    max_num_batched_tokens: int = Field(default=1024, ge=16, le=1_048_576, description="Tokens per step.")
    chunked_prefill: bool = True

    @model_validator(mode="after")
    def _one_decode_token_per_sequence(self) -> BatchConfig:
        if self.max_num_batched_tokens < self.max_batch_size:
            raise FieldProblems(
                FieldProblem(
                    "max_num_batched_tokens",
                    self.max_num_batched_tokens,
                    f"must be >= {{max_batch_size}} ({self.max_batch_size}): one decode token per sequence",
                )
            )
        return self


class KvEventsConfig(Strict):
    """The prefix cache's changes published in vLLM's KV-event wire format, for KV-aware routing.

    Each engine step's blocks stored and removed go out as one batch on a ZMQ PUB socket; a ROUTER
    socket resends the batches from a sequence number (a subscriber that saw a gap). Off by default:
    the gateway's ``kv_routing`` subscribes to both ports of every replica it discovers.
    """

    enabled: bool = False
    port: int = Field(default=KV_EVENTS_PORT, ge=1024, le=65535, description="ZMQ PUB port of the events.")
    replay_port: int = Field(
        default=KV_EVENTS_REPLAY_PORT, ge=1024, le=65535, description="ZMQ ROUTER port of the replays."
    )
    topic: str = Field(default=KV_EVENTS_TOPIC, max_length=256)
    buffer_steps: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Batches kept for replay (one per step with changes)."
    )

    @model_validator(mode="after")
    def _two_ports(self) -> KvEventsConfig:
        if self.port == self.replay_port:
            raise FieldProblems(
                FieldProblem("replay_port", self.replay_port, f"must differ from {{port}} ({self.port})")
            )
        return self


KvRole = Literal["both", "prefill", "decode"]
KvFailurePolicy = Literal["fail", "recompute"]


class KvTransferConfig(Strict):
    """Prefill/decode disaggregation: which half of a request this replica runs, and how KV blocks
    move between the halves (requests carry vLLM's ``kv_transfer_params``).

    ``prefill``: runs prompts sent with ``do_remote_decode``, keeps their blocks under a lease and
    answers with where to fetch them. ``decode``: takes requests with ``do_remote_prefill``, pulls
    the blocks over TCP into its own cache (registered in its prefix cache) and decodes. ``both``:
    an ordinary colocated replica that refuses either kind of transfer request.
    """

    role: KvRole = "both"
    host: str = Field(
        default="",
        max_length=253,
        description="Address the transfer listener binds and that prefill answers name as remote_host; "
        "'': all addresses, answered as this host's name.",
    )
    port: int = Field(
        default=KV_TRANSFER_PORT, ge=1024, le=65535, description="TCP port of the transfer listener."
    )
    lease_s: float = Field(
        default=60.0, gt=0, le=3600, description="How long a prefill keeps blocks nobody has claimed."
    )
    timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="A pull that stalls this long has failed."
    )
    on_failure: KvFailurePolicy = Field(
        default="recompute",
        description="A decode whose pull fails: 'recompute' runs the prompt itself, 'fail' ends the request "
        "with an error naming the prefill replica.",
    )


class CacheConfig(Strict):
    """The paged KV cache and the prefix cache."""

    block_size: int = Field(default=16, ge=1, le=256, description="Tokens per KV block.")
    kv_cache_dtype: KvCacheDtype = "auto"
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=0.98, description="Fraction of each GPU's memory the engine may use."
    )
    cpu_kv_cache_bytes: int = Field(
        default=256 * 1024 * 1024, ge=1024, le=2**44, description="KV cache budget on CPU hosts."
    )
    prefix_caching: bool = True
    kv_events: KvEventsConfig = KvEventsConfig()
    kv_transfer: KvTransferConfig = KvTransferConfig()
    attention_backend: AttentionBackend = Field(
        default="auto",
        description=(
            "How attention reads the paged KV cache: 'auto' takes the fastest that works on the host; "
            "naming one requires it, and a start that cannot run it fails naming the backend and the reason."
        ),
    )

    @model_validator(mode="after")
    def _decode_registers_pulled_blocks(self) -> CacheConfig:
        if self.kv_transfer.role == "decode" and not self.prefix_caching:
            raise FieldProblems(
                FieldProblem(
                    "prefix_caching",
                    self.prefix_caching,
                    "must be true when kv_transfer.role is 'decode': pulled blocks enter the cache by their hashes",
                )
            )
        return self


class ParallelConfig(Strict):
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64)
    expert_parallel_size: int = Field(default=1, ge=1, le=1024)
    nodes_per_replica: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Nodes one replica spans: its pipeline_parallel x max(tensor, expert) ranks split evenly "
        "over them, node 0 (the leader) serving the API; 1: every rank on one node.",
    )
    # A collective waits this long for the slowest rank before the replica fails: long enough for the
    # largest shard's load, which the ranks finish at different times (120 s tripped; NCCL's own
    # default is 10 min). Raise it where shards load slower.
    process_group_timeout_s: float = Field(default=600, ge=30, le=86_400)
    min_bus_gbps: float = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Refuse to start when the ranks' all-reduce bus bandwidth measured at start (GB/s, as "
        "nccl-tests' busbw) is below this; 0 measures and reports only (frontier_interconnect_bus_gbps).",
    )

    @property
    def ranks(self) -> int:
        """Processes of one replica: pipeline stages of max(tensor, expert) parallel ranks each."""
        return self.pipeline_parallel_size * max(self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes_per_replica

    @model_validator(mode="after")
    def _nodes_split_the_ranks(self) -> ParallelConfig:
        if self.ranks % self.nodes_per_replica:
            raise FieldProblems(
                FieldProblem(
                    "nodes_per_replica",
                    self.nodes_per_replica,
                    f"must divide the replica's {self.ranks} ranks (pipeline {self.pipeline_parallel_size} x "
                    f"max(tensor {self.tensor_parallel_size}, expert {self.expert_parallel_size})) so that "
                    "every node holds as many",
                )
            )
        return self


class CpuConfig(Strict):
    cpu_threads: int = Field(
        default=0, ge=0, le=1024, description="Intra-op threads on CPU hosts; 0 = all cores."
    )
    cpu_bind_threads: bool = Field(
        default=False, description="Pin each intra-op thread to a core of its own (one runtime per host)."
    )
    native_kernels: bool = Field(
        default=True,
        description=(
            "Use the runtime's native CPU kernels (attention, fused norms, panel GEMM); false runs torch "
            "ops only, as on a GPU host. The environment variable FRONTIER_NATIVE_KERNELS=0/1 overrides it."
        ),
    )


class RuntimeSettings(CacheConfig, ParallelConfig, CpuConfig):
    """The stack's ``runtime:`` section, exactly as the runtime reads it."""

    port: int = Field(default=8000, ge=1024, le=65535)
    max_concurrency: int = Field(default=16, ge=1, le=65_536, description="Requests in the engine at once.")
    queue: QueueConfig = QueueConfig()
    batch: BatchConfig = BatchConfig()
    api_keys_secret: str | None = Field(
        default=None,
        pattern=SECRET_ID_PATTERN,
        description="Secrets Manager id of the API keys (fetched at start and on reload); None: no auth.",
    )
    api_keys_reload_s: float = Field(
        default=60.0,
        ge=5,
        le=3600,
        description="How often the API keys are read again from their secret (SIGHUP: at once); a "
        "revoked key stops working within this long.",
    )
    weights_cache_dir: str = Field(
        default=CLOUD_WEIGHTS_CACHE,
        min_length=1,
        description="Where verified weights are kept; relative paths are taken from the host's root.",
    )
    weights_fetch_concurrency: int = Field(
        default=WEIGHTS_FETCH_CONCURRENCY,
        ge=1,
        le=WEIGHTS_FETCH_MAX_CONCURRENCY,
        description="GETs in flight while a cold start fetches its weights (1: one file after another); "
        "more reach a wide NIC's rate, each holding up to one part (16-64 MiB) in memory.",
    )
    prepared_cache_max_bytes: int = Field(
        default=PREPARED_CACHE_MAX_BYTES,
        ge=0,
        le=2**50,
        description="Bytes the host's prepared-weights entries may hold together; a start evicts the "
        "least recently used beyond it, never one in use (0: only the entries in use stay).",
    )
    drain_timeout_s: float = Field(default=30.0, ge=0, le=3600, description="In-flight work's grace on stop.")
    max_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    keepalive_s: float = Field(default=15.0, gt=0, le=600, description="SSE comment keep-alive interval.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    json_logs: bool = True
    # Spans of each request (queue wait, prefill, decode) over OTLP to the stack's collector.
    tracing: TracingSettings = TracingSettings()

    @model_validator(mode="after")
    def _transfer_on_one_rank(self) -> RuntimeSettings:
        if self.kv_transfer.role != "both" and self.ranks > 1:
            raise FieldProblems(
                FieldProblem(
                    "kv_transfer.role",
                    self.kv_transfer.role,
                    f"must be 'both' on a replica of {self.ranks} ranks: KV transfer moves one rank's cache",
                )
            )
        return self

    @model_validator(mode="after")
    def _batching_within_admission(self) -> RuntimeSettings:
        if self.batch.max_batch_size > self.max_concurrency:
            raise FieldProblems(
                FieldProblem(
                    "batch.max_batch_size",
                    self.batch.max_batch_size,
                    f"must be <= {{max_concurrency}} ({self.max_concurrency})",
                )
            )
        return self


class RuntimeConfig(RuntimeSettings):
    """``runtime.yaml``: the stack's runtime section, plus what the toolkit derives from the stack's
    other sections (the model, the probe paths, the device of the node group)."""

    model: ModelConfig
    health: HealthConfig = HealthConfig()
    host: str = "0.0.0.0"
    device: Device = "auto"
    seed: int = 0

    @model_validator(mode="after")
    def _whole_prompt_per_step_without_chunking(self) -> RuntimeConfig:
        if not self.batch.chunked_prefill and self.batch.max_num_batched_tokens < self.model.max_seq_len:
            raise FieldProblems(
                FieldProblem(
                    "batch.max_num_batched_tokens",
                    self.batch.max_num_batched_tokens,
                    f"must be >= {{model.max_seq_len}} ({self.model.max_seq_len}) when chunked_prefill is off",
                )
            )
        return self


def parse_config(text: str, source: str = "runtime.yaml") -> RuntimeConfig:
    return parse_model(RuntimeConfig, text, source)


def load_config(path: str | Path) -> RuntimeConfig:
    return load_model(RuntimeConfig, path)
