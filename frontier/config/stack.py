"""Load and validate a stack: ``stacks/Pulumi.<stack>.yaml`` into typed settings.

The stack file is the one source of truth for an environment. Pulumi reads it as project config
(``frontier:<key>``); everything else in Frontier reads it through :func:`load_stack`, which needs
no Pulumi CLI. A bad value fails here, at load time, with the file, the field path, the value and
the allowed range.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from frontier.contracts import CLOUD_WEIGHTS_CACHE, HOST_ROOT
from frontier.errors import StackError
from frontier.project import stacks_dir

PROJECT = "frontier"

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
GIB = 1024**3
GB = 10**9


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Network(_Settings):
    availability_zones: int = Field(ge=2, le=6)
    vpc_cidr: str
    nat: Literal["single", "per_az"]

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        net = ipaddress.ip_network(value, strict=True)
        if not 16 <= net.prefixlen <= 24:
            raise ValueError(f"prefix length must be between /16 and /24, got /{net.prefixlen}")
        return value


class NodeGroup(_Settings):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    instance_type: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    accelerator: Literal["gpu", "cpu"] = "gpu"
    gpus_per_node: int = Field(ge=1, le=16)
    gpu_memory_gb: float = Field(gt=0, le=1024, description="Memory of one GPU (decimal GB).")
    nvlink_domain_gpus: int = Field(ge=1, le=576, description="GPUs joined by NVLink (one node or a rack).")
    min_size: int = Field(ge=0, le=1000)
    desired_size: int = Field(ge=0, le=1000)
    max_size: int = Field(ge=1, le=1000)
    price_per_hour: float = Field(ge=0, le=10_000)
    root_volume_gb: int = Field(default=100, ge=20, le=16_384)
    cache_volume_gb: int = Field(default=200, ge=1, le=65_536)
    efa: bool = False


class Model(_Settings):
    name: str = Field(min_length=1)
    weights_uri: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")
    version: str = Field(min_length=1)
    num_layers: int = Field(ge=1, le=512)
    hidden_size: int = Field(ge=16, le=65_536)
    intermediate_size: int = Field(ge=16, le=262_144)
    num_attention_heads: int = Field(ge=1, le=1024)
    num_kv_heads: int = Field(ge=1, le=1024)
    vocab_size: int = Field(ge=16, le=1_048_576)
    tie_word_embeddings: bool = False
    dtype: Literal["float32", "bfloat16", "float16"]
    max_seq_len: int = Field(ge=16, le=1_048_576)
    num_experts: int = Field(default=0, ge=0, le=1024, description="0 for a dense model.")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_parameters(self) -> int:
        """Parameters of a Llama-family decoder, from its shape."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attention = h * h + 2 * h * kv + h * h
        experts = max(1, self.num_experts)
        mlp = 3 * h * self.intermediate_size * experts + (h * self.num_experts if self.num_experts else 0)
        per_layer = attention + mlp + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings + h


class Queue(_Settings):
    max_length: int = Field(ge=0, le=1_000_000)
    timeout_ms: int = Field(ge=1, le=3_600_000)


class Batch(_Settings):
    window_ms: float = Field(ge=0, le=1000)
    max_batch_size: int = Field(ge=1, le=4096)
    max_num_batched_tokens: int = Field(ge=16, le=1_048_576)
    chunked_prefill: bool = True


class Runtime(_Settings):
    port: int = Field(ge=1024, le=65535)
    max_concurrency: int = Field(ge=1, le=65_536)
    queue: Queue
    batch: Batch
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16", "fp8"] = "auto"
    gpu_memory_utilization: float = Field(gt=0.0, le=0.98)
    reserved_memory_gb: float = Field(
        default=1.0, ge=0, le=256, description="Activations, graphs, workspace."
    )
    tensor_parallel_size: int = Field(ge=1, le=64)
    pipeline_parallel_size: int = Field(ge=1, le=64)
    expert_parallel_size: int = Field(ge=1, le=1024)
    api_keys_secret: str = Field(min_length=1, pattern=r"^[A-Za-z0-9/_+=.@:-]+$")
    image_repository: str = Field(
        default="frontier-runtime",
        pattern=r"^[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._/-]*)?$",
        description="Container repository of the runtime image (ECR URI); deployed by digest only.",
    )
    drain_timeout_s: float = Field(ge=0, le=3600)
    block_size: int = Field(default=16, ge=1, le=256)
    weights_cache_dir: str = Field(
        default=CLOUD_WEIGHTS_CACHE,
        min_length=1,
        description="Where a host keeps verified weights; relative paths are taken from the host's root.",
    )
    cpu_threads: int = Field(
        default=0, ge=0, le=1024, description="Intra-op threads per runtime on CPU hosts; 0 = all cores."
    )


class Health(_Settings):
    readiness_path: str = Field(pattern=r"^/[A-Za-z0-9_./-]*$")
    liveness_path: str = Field(pattern=r"^/[A-Za-z0-9_./-]*$")
    interval_s: int = Field(ge=1, le=300)
    timeout_s: int = Field(ge=1, le=120)
    healthy_threshold: int = Field(ge=1, le=10)
    unhealthy_threshold: int = Field(ge=1, le=10)


class Gate(_Settings):
    window_s: float = Field(ge=0, le=3600)
    max_error_rate: float = Field(ge=0, le=1)
    max_p99_latency_ms: float = Field(gt=0, le=3_600_000)
    min_requests: int = Field(ge=0, le=1_000_000)


class Rollout(_Settings):
    canary_hosts: int = Field(ge=0, le=100)
    batch_size: int = Field(ge=1, le=100, description="Hosts out of service at once after the canary.")
    max_surge: int = Field(ge=0, le=100, description="Extra nodes added first when the group can grow.")
    deregistration_delay_s: int = Field(ge=0, le=3600)
    readiness_timeout_s: float = Field(gt=0, le=7200)
    keep_releases: int = Field(ge=2, le=50)
    gate: Gate


class Slo(_Settings):
    ttft_ms: float = Field(gt=0, le=600_000)
    tpot_ms: float = Field(gt=0, le=60_000)
    p99_latency_ms: float = Field(gt=0, le=3_600_000)
    error_rate: float = Field(ge=0, le=1)


class Capacity(_Settings):
    peak_qps: float = Field(gt=0, le=1_000_000)
    safety_factor: float = Field(ge=1.3, le=1.5, description="Headroom over the peak (the brief: 1.3-1.5).")
    avg_prompt_tokens: int = Field(ge=1, le=1_048_576)
    avg_output_tokens: int = Field(ge=1, le=1_048_576)
    assumed_replica_qps: float = Field(gt=0, le=1_000_000, description="Used until a baseline is measured.")


class Host(_Settings):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    address: str
    ssh_port: int = Field(default=22, ge=1, le=65535)
    root: str = Field(default=HOST_ROOT, min_length=1)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        ipaddress.ip_address(value)
        return value


class Inventory(_Settings):
    source: Literal["static", "aws"]
    ssh_user: str = Field(min_length=1)
    ssh_key_file: str = ""
    ssh_gateway: str = ""
    hosts: tuple[Host, ...] = ()


class Edge(_Settings):
    certificate_arn: str = ""
    ssl_policy: str = "ELBSecurityPolicy-TLS13-1-2-2021-06"
    idle_timeout_s: int = Field(default=300, ge=1, le=4000)
    waf_rate_limit: int = Field(default=0, ge=0, le=2_000_000_000, description="0 turns WAF off.")


class Drivers(_Settings):
    driver_branch: str = Field(pattern=r"^[0-9]{3}$")
    container_toolkit_version: str = Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")


class Monitoring(_Settings):
    alarm_email: str = ""
    queue_depth_alarm: int = Field(ge=1, le=1_000_000)
    # Fraction of the KV cache in use above which an alert fires (preemptions follow soon after).
    kv_usage_alarm: float = Field(default=0.95, gt=0, le=1)


class Local(_Settings):
    state_dir: str = ".frontier/local"
    # The balancer and the moto server listen here only: nothing of the local stack leaves the machine.
    bind_address: str = "127.0.0.1"
    moto_port: int = Field(ge=1024, le=65535)
    balancer_port: int = Field(ge=1024, le=65535)
    balancer_stats_port: int = Field(ge=1024, le=65535)


class Settings(_Settings):
    """Every setting of one stack, typed. Built only by :func:`load_stack`."""

    stack: str
    source: str
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    network: Network
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1)
    model: Model
    runtime: Runtime
    health: Health
    rollout: Rollout
    slo: Slo
    capacity: Capacity
    inventory: Inventory
    edge: Edge
    drivers: Drivers
    monitoring: Monitoring
    local: Local | None = None

    @property
    def serving_group(self) -> NodeGroup:
        """The node group the model is served on (the first one)."""
        return self.node_groups[0]

    @property
    def target(self) -> str:
        """Where the fleet runs: ``local`` (the embedded stack) or ``ec2``; picks the backend."""
        return "local" if self.local is not None else "ec2"


@dataclass(frozen=True)
class Problem:
    path: str
    value: object
    message: str


def stack_path(stack: str) -> Path:
    return stacks_dir() / f"Pulumi.{stack}.yaml"


def available_stacks() -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir().glob("Pulumi.*.yaml"))


def default_stack() -> str:
    return os.environ.get("FRONTIER_STACK") or "local"


def load_stack(stack: str | None = None, *, path: Path | str | None = None) -> Settings:
    """Read ``stacks/Pulumi.<stack>.yaml`` (or ``path``) and return validated settings.

    Raises :class:`StackError` listing every problem as ``file: field = value: what is allowed``.
    """
    stack = stack or default_stack()
    file = Path(path) if path else stack_path(stack)
    if not file.exists():
        known = ", ".join(available_stacks()) or "none"
        raise StackError(f"{file}: no such stack file (stack {stack!r}; known stacks: {known})")
    try:
        document = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise StackError(f"{file}: not valid YAML: {exc}") from exc
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise StackError(f"{file}: expected a top-level 'config:' mapping")
    raw = _unnamespace(config, file)
    raw.update(stack=stack, source=str(file))
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise StackError(_describe(file, _pydantic_problems(exc))) from None
    problems = list(cross_check(settings))
    if problems:
        raise StackError(_describe(file, problems))
    return settings


def _unnamespace(config: dict, file: Path) -> dict:
    """``frontier:model`` → ``model``; ``aws:region`` → ``region``; other namespaces are Pulumi's."""
    raw: dict = {}
    for key, value in config.items():
        namespace, _, name = str(key).partition(":")
        if namespace == PROJECT and name:
            raw[name] = value
        elif key == "aws:region":
            raw["region"] = value
    if "region" not in raw:
        raise StackError(f"{file}: aws:region: missing (set the AWS region of this stack)")
    return raw


def _pydantic_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        value = err.get("input")
        problems.append(Problem(path, None if isinstance(value, dict) else value, err["msg"]))
    return problems


def _describe(file: Path, problems: list[Problem]) -> str:
    lines = [f"{file}: {len(problems)} problem(s)"]
    for p in problems:
        shown = "" if p.value is None else f" = {p.value!r}"
        lines.append(f"  {p.path}{shown}: {p.message}")
    return "\n".join(lines)


def cross_check(s: Settings) -> Iterator[Problem]:
    """Rules that span fields: parallelism vs topology, batching vs queueing, memory fit."""
    rt, model = s.runtime, s.model
    tp, pp, ep = rt.tensor_parallel_size, rt.pipeline_parallel_size, rt.expert_parallel_size

    if rt.batch.max_batch_size > rt.max_concurrency:
        yield Problem(
            "runtime.batch.max_batch_size",
            rt.batch.max_batch_size,
            f"must be <= runtime.max_concurrency ({rt.max_concurrency})",
        )
    if rt.max_concurrency > rt.queue.max_length:
        yield Problem(
            "runtime.max_concurrency",
            rt.max_concurrency,
            f"must be <= runtime.queue.max_length ({rt.queue.max_length}): the queue must hold one full wave",
        )
    if rt.batch.max_num_batched_tokens < rt.batch.max_batch_size:
        yield Problem(
            "runtime.batch.max_num_batched_tokens",
            rt.batch.max_num_batched_tokens,
            f"must be >= runtime.batch.max_batch_size ({rt.batch.max_batch_size}): one decode token per sequence",
        )
    if not rt.batch.chunked_prefill and rt.batch.max_num_batched_tokens < model.max_seq_len:
        yield Problem(
            "runtime.batch.max_num_batched_tokens",
            rt.batch.max_num_batched_tokens,
            f"must be >= model.max_seq_len ({model.max_seq_len}) when chunked_prefill is off",
        )
    if model.hidden_size % model.num_attention_heads:
        yield Problem(
            "model.hidden_size",
            model.hidden_size,
            f"must be divisible by model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_attention_heads % model.num_kv_heads:
        yield Problem(
            "model.num_kv_heads",
            model.num_kv_heads,
            f"must divide model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_attention_heads % tp:
        yield Problem(
            "runtime.tensor_parallel_size",
            tp,
            f"must divide model.num_attention_heads ({model.num_attention_heads})",
        )
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        yield Problem(
            "runtime.tensor_parallel_size",
            tp,
            f"must divide model.num_kv_heads ({model.num_kv_heads}) or be a multiple of it (KV heads are "
            "split across tensor-parallel ranks, or replicated when there are fewer heads than ranks)",
        )
    if model.num_layers % pp:
        yield Problem(
            "runtime.pipeline_parallel_size", pp, f"must divide model.num_layers ({model.num_layers})"
        )
    if ep > 1 and model.num_experts == 0:
        yield Problem(
            "runtime.expert_parallel_size", ep, "must be 1 for a dense model (model.num_experts = 0)"
        )
    if model.num_experts and model.num_experts % ep:
        yield Problem(
            "runtime.expert_parallel_size", ep, f"must divide model.num_experts ({model.num_experts})"
        )

    names = [group.name for group in s.node_groups]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield Problem(f"node_groups[{i}].name", name, "must be unique among node_groups")

    for i, group in enumerate(s.node_groups):
        where = f"node_groups[{i}]"
        if not group.min_size <= group.desired_size <= group.max_size:
            yield Problem(
                f"{where}.desired_size",
                group.desired_size,
                f"must lie within min_size ({group.min_size}) .. max_size ({group.max_size})",
            )
        if tp * pp > group.gpus_per_node:
            yield Problem(
                "runtime.tensor_parallel_size",
                tp,
                f"tensor ({tp}) x pipeline ({pp}) parallel = {tp * pp} GPUs must fit the "
                f"{group.gpus_per_node} GPUs per node of node group {group.name!r}",
            )
        if ep > group.nvlink_domain_gpus:
            yield Problem(
                "runtime.expert_parallel_size",
                ep,
                f"an expert-parallel group must stay inside one NVLink domain: node group {group.name!r} "
                f"has nvlink_domain_gpus = {group.nvlink_domain_gpus}",
            )
        fit = memory_fit(s, group)
        if not fit.fits:
            yield Problem(
                f"{where}.gpu_memory_gb",
                group.gpu_memory_gb,
                "the model does not fit: " + fit.explain(),
            )

    desired = s.serving_group.desired_size
    if desired > 1:
        # A rollout takes the canary hosts, then batch_size hosts, out of service at once; either way
        # at least one host must keep serving.
        for field in ("canary_hosts", "batch_size"):
            value = getattr(s.rollout, field)
            if value >= desired:
                yield Problem(
                    f"rollout.{field}",
                    value,
                    f"must be < node_groups[0].desired_size ({desired}) so that a host keeps serving",
                )
    if s.rollout.deregistration_delay_s > s.runtime.drain_timeout_s + 600:
        yield Problem(
            "rollout.deregistration_delay_s",
            s.rollout.deregistration_delay_s,
            f"is far beyond runtime.drain_timeout_s ({s.runtime.drain_timeout_s}); keep them close",
        )
    if s.health.timeout_s >= s.health.interval_s and s.health.interval_s > 1:
        yield Problem(
            "health.timeout_s", s.health.timeout_s, f"must be < health.interval_s ({s.health.interval_s})"
        )
    if s.health.readiness_path == s.health.liveness_path:
        yield Problem(
            "health.readiness_path",
            s.health.readiness_path,
            "must differ from health.liveness_path: readiness drains, liveness restarts",
        )
    if s.inventory.source == "static" and not s.inventory.hosts:
        yield Problem("inventory.hosts", [], "a static inventory needs at least one host")
    seen_names: set[str] = set()
    seen_slots: set[tuple[str, int, str]] = set()
    for i, host in enumerate(s.inventory.hosts):
        if host.name in seen_names:
            yield Problem(f"inventory.hosts[{i}].name", host.name, "must be unique among inventory.hosts")
        slot = (host.address, host.ssh_port, host.root)
        if slot in seen_slots:
            yield Problem(
                f"inventory.hosts[{i}].root",
                host.root,
                f"another host already uses {host.address}:{host.ssh_port} with this root",
            )
        seen_names.add(host.name)
        seen_slots.add(slot)
    if s.local is not None:
        ports = {
            "runtime.port": s.runtime.port,
            "local.moto_port": s.local.moto_port,
            "local.balancer_port": s.local.balancer_port,
            "local.balancer_stats_port": s.local.balancer_stats_port,
        }
        taken: dict[int, str] = {}
        for field, port in ports.items():
            if port in taken:
                yield Problem(field, port, f"must differ from {taken[port]} (both listen on this machine)")
            taken.setdefault(port, field)
    if s.target != "local" and not s.edge.certificate_arn.startswith("arn:aws:acm:"):
        yield Problem(
            "edge.certificate_arn", s.edge.certificate_arn, "must be an ACM certificate ARN (HTTPS only)"
        )
    if s.slo.p99_latency_ms < s.slo.ttft_ms:
        yield Problem("slo.p99_latency_ms", s.slo.p99_latency_ms, f"must be >= slo.ttft_ms ({s.slo.ttft_ms})")


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


def kv_cache_dtype_bytes(s: Settings) -> int:
    dtype = s.runtime.kv_cache_dtype
    return DTYPE_BYTES[s.model.dtype if dtype == "auto" else dtype]


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


def memory_fit(s: Settings, group: NodeGroup) -> MemoryFit:
    rt, model = s.runtime, s.model
    shards = rt.tensor_parallel_size * rt.pipeline_parallel_size
    weights = model.num_parameters * DTYPE_BYTES[model.dtype]
    dtype_bytes = kv_cache_dtype_bytes(s)
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
