"""The performance of one serving replica from first principles: a roofline per engine step.

One engine step runs every scheduled token through every layer once. Per GPU of a replica:

- memory time  = (weight bytes / TP + KV bytes read) / (bandwidth x eff.bandwidth)
  weight bytes = the matmul parameters (attention, MLP, LM head; embeddings are looked up, not
  read whole) x bytes per parameter; KV bytes read = decoding sequences x their context x KV bytes
  per token per GPU (``memory.kv_bytes_per_token``).
- compute time = FLOPs / (peak x eff.flops), FLOPs = 2 x matmul parameters x tokens / TP plus
  attention, 4 x layers x hidden x positions attended per token / TP (QK^T and AV).
- the step takes max(memory, compute): decode (few tokens, all weights) is bound by bandwidth,
  prefill (many tokens per weight read) by FLOPs. That assumes the two overlap, as on a GPU; a
  single CPU core does not overlap them (``eff.overlap`` = 0 adds the shorter one), and its BLAS
  packs each weight matrix before a multi-row GEMM, so the weights cross memory
  ``eff.gemm_weight_passes`` times (read, write packed, read packed: 3) when a step has more than
  one token — a one-token step is a GEMV that reads them once;
- plus the tensor-parallel all-reduces, 2 per layer (after attention and after the MLP) of
  tokens x hidden activations, at ring cost 2 (TP - 1) / TP x bytes / (link bandwidth x eff.link) +
  a fixed latency each;
- plus the engine's own time: a fixed overhead per step, one per layer (each layer's ops
  dispatched from Python) and one per scheduled sequence (scheduling, sampling, detokenising) —
  software, not physics, hence the figures calibration fits.

A replica at concurrency c (a closed loop: c requests in flight, each ``prompt`` tokens in and
``output`` tokens out) runs b = min(c, max_batch_size) sequences; the rest wait in its queue. The
scheduler's token budget (``max_num_batched_tokens``) holds the decode tokens and the prefill chunks
of one step: each sequence needs its prompt once every ``output`` decode steps, so an average step
carries b decode tokens and b x prompt / output prefill tokens; when that exceeds the budget a
sequence's tokens take more steps than it has output tokens.

Mixture of experts, expert parallel (EP) and pipeline parallel (PP), per GPU of one stage:

- a stage has G = max(TP, EP) GPUs: attention runs tensor-parallel in G / TP data-parallel groups
  (each takes 1 / (G / TP) of the tokens), the experts are spread over EP ranks (each rank's experts
  split over G / EP GPUs when EP < TP). Attention, router and LM head are read whole every step;
  of the experts, only those the step's tokens hit: with B tokens each sent to k of E experts, the
  expected number of distinct experts touched is E (1 - (1 - k / E)^B). The busiest EP rank holds
  min(E / EP, touched / EP x imbalance) of them (``model.expert_load_imbalance``) and sets the pace;
  its expert FLOPs are 2 x expert parameters x B x k / G x imbalance. That is a fused grouped GEMM
  (``eff.expert_gemms = "fused"``, the GPU engines'). The CPU engine runs one GEMM per expert in use,
  one after another (``"serial"``): each expert's GEMM of M ~ Binomial(B, k / E) rows is then its own
  roofline, its rows padded to the kernel's row tile (``eff.gemm_row_tile``), plus the engine's own
  time per sparse layer and per expert GEMM (``eff.moe_layer_overhead_s``, ``eff.expert_overhead_s``,
  fitted on the engine by ``cpu.fit_moe_overhead``).
- the EP all-to-all per MoE layer, dispatch + combine: each GPU sends B x k / G token copies x hidden
  x bytes x 2 x (EP - 1) / EP; inside the NVLink domain at the link's bandwidth, outside it the share
  bound for other domains at the node's network bandwidth (EFA) per GPU, plus a latency per phase
  (``allreduce_latency_s`` inside, ``network_latency_s`` across).
- PP: each stage holds layers / PP; as the engine runs it, the batch goes through as m = min(sequences,
  PP) steps in flight, one per stage, each of its own sequences (tokens / m) in one micro-batch, each
  re-reading the stage's weights and sending its activations (tokens / m x hidden x bytes, split over
  the stage's G GPUs) to the next stage, over NVLink while the replica fits the NVLink domain, else
  over the network. With a step per stage no stage waits; with fewer sequences than stages (m < PP)
  each step still crosses all PP stages, so a stage idles (PP - m) / PP of the time.

Everything here is arithmetic on typed inputs: devices come from ``gpus.py`` (datasheets) or from
the CPU micro-benchmark (``cpu.py``), efficiency factors from defaults or from ``calibrate.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from frontier.capacity.gpus import INSTANCES
from frontier.config.memory import kv_bytes_per_token, projection_bytes_per_parameter
from frontier.config.schema import DTYPE_BYTES, Model, PoolSettings, Slo
from frontier.errors import FrontierError


class NotModelled(FrontierError):
    """A valid stack the roofline has no model for (a mixture of experts without its router's top-k)."""


@dataclass(frozen=True)
class Device:
    """One accelerator of a replica (a GPU, or the CPU of a local host)."""

    name: str
    memory_bytes: float
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s at the model's compute dtype
    link_bandwidth: float  # bytes/s per device, one direction (tensor-parallel all-reduce)
    source: str


@dataclass(frozen=True)
class Efficiency:
    """Fractions of the peaks a real step reaches, and the engine's own time per step."""

    bandwidth: float
    flops: float
    link: float
    allreduce_latency_s: float
    step_overhead_s: float
    seq_overhead_s: float
    source: str  # "modelled: …" or "calibrated: …"
    overlap: float = 1.0  # share of the shorter of memory and compute time hidden under the longer
    gemm_weight_passes: float = 1.0  # times the weights cross memory in a step of more than one token
    layer_overhead_s: float = 0.0  # the engine's own time per layer per step (op dispatch)
    # The HTTP server's time where it shares the engine's cores (a CPU replica: one process, one GIL):
    # per request (parse, tokenise, open and close the stream) and per streamed token (detokenise, one
    # server-sent event). On a GPU host the server runs on other cores than the GPU's work: 0.
    request_overhead_s: float = 0.0
    token_overhead_s: float = 0.0
    # One all-to-all phase or stage send over the network (EFA with its RDMA path: tens of µs, against
    # NCCL's ~10 µs over NVLink).
    network_latency_s: float = 30e-6
    # A sparse layer's costs beyond its weights and FLOPs, where the engine is fitted (a CPU replica):
    # the GEMM computes rows in tiles of ``gemm_row_tile`` (the CPU panel kernel's 8-row register
    # tile), so an expert's GEMM of M rows does the work of ceil(M / tile) x tile rows; the engine's
    # own time per sparse layer (router, top-k, sorting the token-expert pairs, gathering the rows
    # and adding them back) and per expert GEMM it runs (dispatching the expert's ops; each small
    # GEMM's weight stream starting cold). On a GPU these are left at 1 and 0: a step's few expert
    # GEMMs hide under the 2 ms step overhead, and no engine there has been fitted.
    gemm_row_tile: int = 1
    moe_layer_overhead_s: float = 0.0
    expert_overhead_s: float = 0.0
    # How the engine runs a sparse layer's experts: "fused", one grouped GEMM over all of them (the
    # GPU engines' fused-MoE kernel: the experts' bytes and FLOPs overlap with the rest of the step),
    # or "serial", one GEMM per expert after another (the CPU engine): each is its own roofline,
    # max(its weights / bandwidth, its padded rows' FLOPs / peak), so an expert with more rows than a
    # tile waits on arithmetic while another one's weights could have streamed.
    expert_gemms: Literal["fused", "serial"] = "fused"

    def __post_init__(self) -> None:
        for name in ("bandwidth", "flops", "link"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise FrontierError(f"efficiency.{name} = {value!r}: must lie in (0, 1]")
        for name in (
            "allreduce_latency_s",
            "step_overhead_s",
            "seq_overhead_s",
            "layer_overhead_s",
            "request_overhead_s",
            "token_overhead_s",
            "network_latency_s",
            "moe_layer_overhead_s",
            "expert_overhead_s",
        ):
            value = getattr(self, name)
            if not value >= 0:
                raise FrontierError(f"efficiency.{name} = {value!r}: must be >= 0")
        if not 0 <= self.overlap <= 1:
            raise FrontierError(f"efficiency.overlap = {self.overlap!r}: must lie in [0, 1]")
        if not self.gemm_weight_passes >= 1:
            raise FrontierError(f"efficiency.gemm_weight_passes = {self.gemm_weight_passes!r}: must be >= 1")
        if self.expert_gemms not in ("fused", "serial"):
            raise FrontierError(
                f"efficiency.expert_gemms = {self.expert_gemms!r}: must be 'fused' or 'serial'"
            )
        if not (isinstance(self.gemm_row_tile, int) and self.gemm_row_tile >= 1):
            raise FrontierError(f"efficiency.gemm_row_tile = {self.gemm_row_tile!r}: must be an integer >= 1")

    def with_overhead_scale(self, k: float, source: str) -> Efficiency:
        return replace(
            self,
            step_overhead_s=self.step_overhead_s * k,
            seq_overhead_s=self.seq_overhead_s * k,
            layer_overhead_s=self.layer_overhead_s * k,
            request_overhead_s=self.request_overhead_s * k,
            token_overhead_s=self.token_overhead_s * k,
            moe_layer_overhead_s=self.moe_layer_overhead_s * k,
            expert_overhead_s=self.expert_overhead_s * k,
            source=source,
        )


# Typical of a CUDA serving engine: decode GEMVs reach ~80 % of HBM bandwidth, mixed steps ~60 % of
# dense peak, NCCL rings ~70 % of NVLink/PCIe; a Python engine spends ~2 ms of its own per step.
GPU_EFFICIENCY = Efficiency(
    bandwidth=0.8,
    flops=0.6,
    link=0.7,
    allreduce_latency_s=10e-6,
    step_overhead_s=2e-3,
    seq_overhead_s=10e-6,
    source="modelled: default GPU efficiencies (80 % bandwidth, 60 % FLOPs, 70 % link, 2 ms/step)",
)


@dataclass(frozen=True)
class Shape:
    """A Llama-family decoder, dense or with a mixture-of-experts MLP, as far as the roofline needs it."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    dtype_bytes: int
    experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0
    expert_intermediate: int = 0
    expert_load_imbalance: float = 1.0
    # Bytes per weight of the linear projections (model.quantization: 1 + scales); 0: dtype_bytes.
    projection_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.experts and not 1 <= self.experts_per_token <= self.experts:
            raise FrontierError(
                f"experts_per_token = {self.experts_per_token}: must lie in 1 .. experts ({self.experts})"
            )
        if self.expert_load_imbalance < 1:
            raise FrontierError(f"expert_load_imbalance = {self.expert_load_imbalance}: must be >= 1")

    @classmethod
    def from_model(cls, model: Model) -> Shape:
        if model.num_experts and not model.num_experts_per_token:
            raise NotModelled(
                f"model.num_experts_per_token = 0 with model.num_experts = {model.num_experts}: the roofline "
                "needs the router's top-k to know which experts a step reads"
            )
        return cls(
            layers=model.num_layers,
            hidden=model.hidden_size,
            intermediate=model.intermediate_size,
            heads=model.num_attention_heads,
            kv_heads=model.num_kv_heads,
            vocab=model.vocab_size,
            dtype_bytes=DTYPE_BYTES[model.dtype],
            experts=model.num_experts,
            experts_per_token=model.num_experts_per_token,
            expert_intermediate=model.expert_intermediate_size,
            expert_load_imbalance=model.expert_load_imbalance,
            projection_bytes=projection_bytes_per_parameter(model),
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def attention_parameters(self) -> int:
        """One layer's q, o (hidden x hidden each), k and v (hidden x KV heads x head_dim each)."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_heads * self.head_dim

    @property
    def expert_parameters(self) -> int:
        """One expert's gate, up and down projections."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def dense_parameters(self) -> int:
        """What every step reads whole: all layers' attention and dense MLP (or router), and the LM head."""
        mlp = self.hidden * self.experts if self.experts else 3 * self.hidden * self.intermediate
        return self.layers * (self.attention_parameters + mlp) + self.vocab * self.hidden

    @property
    def weight_bytes(self) -> float:
        """Bytes per weight of a linear projection (quantized or in the model dtype)."""
        return self.projection_bytes or self.dtype_bytes

    @property
    def dense_bytes(self) -> float:
        """Bytes of :attr:`dense_parameters`: the projections as quantized, router and LM head in the dtype."""
        unquantized = self.layers * self.hidden * self.experts + self.vocab * self.hidden  # routers, LM head
        projections = self.dense_parameters - unquantized
        return projections * self.weight_bytes + unquantized * self.dtype_bytes

    @property
    def layer_matmul_parameters(self) -> int:
        """q and o (hidden x hidden each), k and v (hidden x KV heads x head_dim each), gate/up/down."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_heads * self.head_dim + 3 * h * self.intermediate

    @property
    def matmul_parameters(self) -> int:
        """Every weight a decode step multiplies by: all layers plus the LM head."""
        return self.layers * self.layer_matmul_parameters + self.vocab * self.hidden


@dataclass(frozen=True)
class Replica:
    """The settings of one replica that shape its steps."""

    shape: Shape
    tensor_parallel: int
    kv_bytes_per_token_per_gpu: int  # KV heads / TP, layers / PP
    max_batch_size: int
    max_num_batched_tokens: int
    max_concurrency: int
    chunked_prefill: bool
    pipeline_parallel: int = 1
    expert_parallel: int = 1
    nvlink_domain_gpus: int = 8
    network_bandwidth: float = 0.0  # bytes/s per GPU, one direction, outside the NVLink domain

    def __post_init__(self) -> None:
        sh, tp, ep, pp = self.shape, self.tensor_parallel, self.expert_parallel, self.pipeline_parallel
        if ep > 1 and not sh.experts:
            raise FrontierError(f"expert_parallel = {ep}: a dense model (0 experts) has no experts to spread")
        if sh.experts and (ep > sh.experts or sh.experts % ep):
            raise FrontierError(f"expert_parallel = {ep}: must divide the model's {sh.experts} experts")
        if max(tp, ep) % min(tp, ep):
            raise FrontierError(
                f"expert_parallel = {ep}, tensor_parallel = {tp}: the larger must be a multiple of the "
                "smaller (a stage's GPUs hold whole tensor-parallel groups and whole expert ranks)"
            )
        if pp > sh.layers:
            raise FrontierError(f"pipeline_parallel = {pp}: more stages than the model's {sh.layers} layers")
        if sh.layers % pp:
            # The engine would split unevenly (its first stages one layer longer) and the slowest
            # stage sets the pace; the model times equal stages of layers / PP, so it refuses instead,
            # as the stack's check does (runtime.pipeline_parallel_size must divide model.num_layers).
            raise FrontierError(
                f"pipeline_parallel = {pp}: must divide the model's {sh.layers} layers (stages of "
                f"{sh.layers / pp:g} layers)"
            )

    @property
    def stage_gpus(self) -> int:
        """G = max(TP, EP): the GPUs of one pipeline stage."""
        return max(self.tensor_parallel, self.expert_parallel)

    @property
    def attention_groups(self) -> int:
        """Tensor-parallel attention groups per stage, each with its share of the tokens."""
        return self.stage_gpus // self.tensor_parallel

    @property
    def gpus(self) -> int:
        return self.pipeline_parallel * self.stage_gpus

    @classmethod
    def from_pool(cls, pool: PoolSettings) -> Replica:
        """A replica of ``pool``: its model, its runtime's layout and batching, on its node group."""
        model, rt, group = pool.model, pool.runtime, pool.group
        kv_dtype = model.dtype if rt.kv_cache_dtype == "auto" else rt.kv_cache_dtype
        tp, pp = rt.tensor_parallel_size, rt.pipeline_parallel_size
        instance = INSTANCES.get(group.instance_type)
        return cls(
            shape=Shape.from_model(model),
            tensor_parallel=tp,
            kv_bytes_per_token_per_gpu=kv_bytes_per_token(model, DTYPE_BYTES[kv_dtype], tp, pp),
            max_batch_size=rt.batch.max_batch_size,
            max_num_batched_tokens=rt.batch.max_num_batched_tokens,
            max_concurrency=rt.max_concurrency,
            chunked_prefill=rt.batch.chunked_prefill,
            pipeline_parallel=pp,
            expert_parallel=rt.expert_parallel_size,
            nvlink_domain_gpus=group.nvlink_domain_gpus,
            network_bandwidth=instance.network_bandwidth if instance is not None else 0.0,
        )


@dataclass(frozen=True)
class Step:
    """One engine step on one GPU of the replica, and where its time goes."""

    tokens: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    memory_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    overlap: float = 1.0
    alltoall_s: float = 0.0  # the expert-parallel share of comm_s
    bubble_s: float = 0.0  # pipeline fill and drain
    microbatches: int = 1
    experts_s: float = 0.0  # serial expert GEMMs, each its own roofline (Efficiency.expert_gemms)

    @property
    def bound(self) -> Literal["memory", "compute"]:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def total_s(self) -> float:
        longer, shorter = max(self.memory_s, self.compute_s), min(self.memory_s, self.compute_s)
        return (
            longer
            + (1 - self.overlap) * shorter
            + self.experts_s
            + self.comm_s
            + self.overhead_s
            + self.bubble_s
        )


def allreduce_s(device: Device, eff: Efficiency, tensor_parallel: int, message_bytes: float) -> float:
    """A ring all-reduce: each rank sends and receives 2 (n - 1) / n of the message, plus a latency."""
    if tensor_parallel == 1:
        return 0.0
    share = 2 * (tensor_parallel - 1) / tensor_parallel
    return share * message_bytes / (device.link_bandwidth * eff.link) + eff.allreduce_latency_s


def experts_touched(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts that ``tokens`` tokens, each routed to ``top_k`` of ``experts``, hit:
    each expert is missed by one token with probability 1 - k / E, by all of them with its B-th power."""
    if tokens <= 0:
        return 0.0
    missed_by_all: float = (1 - top_k / experts) ** tokens
    return experts * (1 - missed_by_all)


def expert_gemm_rows(experts: int, top_k: int, tokens: float, row_tile: int) -> float:
    """Expected rows one sparse layer's expert GEMMs compute for ``tokens`` tokens, each routed to
    ``top_k`` of ``experts``, when a GEMM computes whole tiles of ``row_tile`` rows.

    An expert receives M ~ Binomial(tokens, k / E) rows and computes ceil(M / tile) x tile of them;
    E[ceil(M / tile)] = sum over j >= 0 of P(M > j x tile). A fractional token count (a mean step)
    is interpolated between its two neighbours. With a tile of 1 this is tokens x k exactly.
    """
    if row_tile == 1 or tokens <= 0:
        return max(0.0, tokens) * top_k
    low = math.floor(tokens)
    share = tokens - low
    rows = (1 - share) * _padded_rows(experts, top_k, low, row_tile)
    if share:
        rows += share * _padded_rows(experts, top_k, low + 1, row_tile)
    return rows


def _padded_rows(experts: int, top_k: int, tokens: int, row_tile: int) -> float:
    tiles = sum(-(-m // row_tile) * prob for m, prob in enumerate(_rows_pmf(experts, top_k, tokens)))
    return experts * row_tile * tiles


def _rows_pmf(experts: int, top_k: int, tokens: int) -> list[float]:
    """P(an expert receives m of ``tokens`` tokens), m = 0 .. tokens: Binomial(tokens, k / E),
    in log space (a prefill step's thousands of tokens overflow the binomial coefficient)."""
    p = top_k / experts
    if p >= 1:
        return [0.0] * tokens + [1.0]
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(tokens + 1)
    return [
        math.exp(log_n - math.lgamma(m + 1) - math.lgamma(tokens - m + 1) + m * log_p + (tokens - m) * log_q)
        for m in range(tokens + 1)
    ]


def serial_experts_s(device: Device, eff: Efficiency, replica: Replica, tokens: float) -> float:
    """One sparse layer's expert GEMMs run one after another, on the busiest GPU: each expert's
    GEMM of M ~ Binomial(tokens, k / E) rows takes max(its weights / bandwidth, 2 x its parameters x
    ceil(M / tile) x tile / FLOP/s) when M > 0, nothing when no token chose it; the busiest rank runs
    the E / EP experts it holds (times the load imbalance), each split over the G / EP GPUs it spans."""
    sh, ep, g = replica.shape, replica.expert_parallel, replica.stage_gpus
    per_gpu = sh.expert_parameters * ep / g
    stream_s = per_gpu * sh.weight_bytes / (device.bandwidth * eff.bandwidth)
    row_s = 2 * per_gpu / (device.flops * eff.flops)
    tile = eff.gemm_row_tile

    def expert_s(n: int) -> float:
        pmf = _rows_pmf(sh.experts, sh.experts_per_token, n)
        return sum(prob * max(stream_s, row_s * -(-m // tile) * tile) for m, prob in enumerate(pmf) if m)

    low = math.floor(tokens)
    share = tokens - low
    one = (1 - share) * expert_s(low) + (share * expert_s(low + 1) if share else 0.0)
    imbalance = sh.expert_load_imbalance if ep > 1 else 1.0
    return sh.experts / ep * one * imbalance


def busiest_rank_experts(shape: Shape, expert_parallel: int, tokens: float) -> float:
    """Experts the busiest expert-parallel rank runs in one layer: its fair share of those touched,
    times the load imbalance, never more than the E / EP it holds."""
    touched = experts_touched(shape.experts, shape.experts_per_token, tokens)
    if expert_parallel == 1:
        return touched
    held = shape.experts / expert_parallel
    return min(held, touched / expert_parallel * shape.expert_load_imbalance)


def alltoall_s(device: Device, eff: Efficiency, replica: Replica, tokens: float) -> float:
    """One MoE layer's dispatch + combine for ``tokens`` tokens of one stage, on one GPU.

    Each GPU sends B x k / G token copies x hidden x bytes, twice (there and back), of which
    (EP - 1) / EP leave it; when the stage is larger than the NVLink domain, the share bound for
    ranks in other domains crosses the network (both parts move at once: the slower sets the time).
    """
    ep = replica.expert_parallel
    sh = replica.shape
    if ep == 1 or not sh.experts:
        return 0.0
    g, domain = replica.stage_gpus, replica.nvlink_domain_gpus
    sent = tokens * sh.experts_per_token / g * sh.hidden * sh.dtype_bytes * 2 * (ep - 1) / ep
    if g <= domain:
        return sent / (device.link_bandwidth * eff.link) + 2 * eff.allreduce_latency_s
    if replica.network_bandwidth <= 0:
        raise FrontierError(
            f"expert_parallel = {ep} over {g} GPUs leaves the NVLink domain of {domain} GPUs, and the "
            "instance type's network bandwidth is unknown (add it to frontier/capacity/gpus.py NETWORK_GBPS)"
        )
    peers_inside = max(1, ep * domain // g) - 1  # other EP ranks in this GPU's domain
    across = sent * (ep - 1 - peers_inside) / (ep - 1)
    inside = sent - across
    return (
        max(inside / (device.link_bandwidth * eff.link), across / (replica.network_bandwidth * eff.link))
        + 2 * eff.network_latency_s
    )


def pipeline_bubble(pipeline_parallel: int, microbatches: int) -> float:
    """The share of the time a stage waits with m steps in flight over PP stages: (PP - m) / PP
    while m < PP (each step crosses every stage in turn), none once a step per stage is in flight."""
    if pipeline_parallel < 1 or microbatches < 1:
        raise FrontierError(
            f"pipeline_parallel = {pipeline_parallel}, microbatches = {microbatches}: both must be >= 1"
        )
    return max(0, pipeline_parallel - microbatches) / pipeline_parallel


def microbatches(pipeline_parallel: int, sequences: float) -> int:
    """Steps in flight, one micro-batch each: one per stage, never more than there are sequences."""
    if pipeline_parallel == 1:
        return 1
    return max(1, min(pipeline_parallel, int(sequences)))


def stage_send_s(device: Device, eff: Efficiency, replica: Replica, tokens: float) -> float:
    """One micro-batch's activations to the next stage, split over the stage's GPUs."""
    if replica.pipeline_parallel == 1:
        return 0.0
    sh = replica.shape
    sent = tokens * sh.hidden * sh.dtype_bytes / replica.stage_gpus
    if replica.gpus <= replica.nvlink_domain_gpus:
        return sent / (device.link_bandwidth * eff.link) + eff.allreduce_latency_s
    if replica.network_bandwidth <= 0:
        raise FrontierError(
            f"pipeline_parallel = {replica.pipeline_parallel} over {replica.gpus} GPUs leaves the NVLink "
            f"domain of {replica.nvlink_domain_gpus} GPUs, and the instance type's network bandwidth is "
            "unknown (add it to frontier/capacity/gpus.py NETWORK_GBPS)"
        )
    return sent / (replica.network_bandwidth * eff.link) + eff.network_latency_s


def step(
    device: Device,
    eff: Efficiency,
    replica: Replica,
    *,
    decode_seqs: float,
    context: float,
    prefill_tokens: float = 0.0,
    prefill_attended: float = 0.0,
    new_requests: float = 0.0,
) -> Step:
    """A step that decodes ``decode_seqs`` sequences of ``context`` tokens each and prefills
    ``prefill_tokens`` prompt tokens that attend to ``prefill_attended`` positions on average.

    A prefill chunk also reads the KV of its prompt's earlier chunks once; that read is left out
    (it is per chunk, not per token, and small beside the weights).
    """
    sh, tp, pp, ep = (
        replica.shape,
        replica.tensor_parallel,
        replica.pipeline_parallel,
        replica.expert_parallel,
    )
    g, groups = replica.stage_gpus, replica.attention_groups
    tokens = decode_seqs + prefill_tokens
    seqs = decode_seqs + (1 if prefill_tokens else 0)
    m = microbatches(pp, seqs)
    stage_layers = sh.layers / pp
    # One micro-batch through one stage, on one GPU: memory, FLOPs and traffic per micro-batch, times m.
    micro = tokens / m
    mine = micro / groups  # the tokens of this GPU's attention group
    dense_bytes = sh.dense_bytes / (tp * pp)
    expert_bytes = 0.0
    expert_flops = 0.0
    moe_overhead_s = 0.0
    if sh.experts:
        ranks_share = busiest_rank_experts(sh, ep, micro)
        # An EP rank's experts are split over the G / EP GPUs it spans (tensor-parallel experts).
        expert_bytes = stage_layers * ranks_share * sh.expert_parameters * sh.weight_bytes * ep / g
        imbalance = sh.expert_load_imbalance if ep > 1 else 1.0
        rows = expert_gemm_rows(sh.experts, sh.experts_per_token, micro, eff.gemm_row_tile)
        expert_flops = 2 * sh.expert_parameters * stage_layers * rows / g * imbalance
        moe_overhead_s = m * stage_layers * (eff.moe_layer_overhead_s + eff.expert_overhead_s * ranks_share)
    weight_bytes = m * (dense_bytes + expert_bytes)
    kv_bytes = decode_seqs / groups * context * replica.kv_bytes_per_token_per_gpu
    linear_flops = m * (2 * sh.dense_parameters * mine / (tp * pp) + expert_flops)
    attended = decode_seqs * context + prefill_tokens * prefill_attended
    attention_flops = 4 * stage_layers * sh.hidden * attended / groups / tp
    flops = linear_flops + attention_flops
    message = mine * sh.hidden * sh.dtype_bytes
    passes = eff.gemm_weight_passes if tokens > 1 else 1.0
    # Serial expert GEMMs are timed one by one (``serial_experts_s``), outside the overlapped rest.
    experts_s = 0.0
    overlapped_bytes, overlapped_flops = weight_bytes, flops
    if sh.experts and eff.expert_gemms == "serial":
        experts_s = m * stage_layers * serial_experts_s(device, eff, replica, micro)
        overlapped_bytes -= m * expert_bytes
        overlapped_flops -= m * expert_flops
    memory_s = (overlapped_bytes * passes + kv_bytes) / (device.bandwidth * eff.bandwidth)
    compute_s = overlapped_flops / (device.flops * eff.flops)
    a2a = m * stage_layers * alltoall_s(device, eff, replica, micro) if sh.experts else 0.0
    comm_s = m * (
        2 * stage_layers * allreduce_s(device, eff, tp, message) + stage_send_s(device, eff, replica, micro)
    )
    comm_s += a2a
    overhead_s = eff.step_overhead_s + eff.layer_overhead_s * stage_layers * m + eff.seq_overhead_s * seqs
    overhead_s += moe_overhead_s
    # The server's share where it runs on the engine's cores: a token streamed per decoding sequence,
    # and the requests whose prompts this step starts.
    overhead_s += eff.token_overhead_s * decode_seqs + eff.request_overhead_s * new_requests
    longer, shorter = max(memory_s, compute_s), min(memory_s, compute_s)
    busy = (
        longer + (1 - eff.overlap) * shorter + experts_s + comm_s
    )  # the stage's work for all m micro-batches
    # Fewer steps in flight than stages: each still crosses all PP stages, PP - m stage times idle.
    bubble_s = busy / m * max(0, pp - m)
    return Step(
        tokens=tokens,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        flops=flops,
        memory_s=memory_s,
        compute_s=compute_s,
        comm_s=comm_s,
        overhead_s=overhead_s,
        overlap=eff.overlap,
        alltoall_s=a2a,
        bubble_s=bubble_s,
        microbatches=m,
        experts_s=experts_s,
    )


def decode_tokens_per_s(
    device: Device, eff: Efficiency, replica: Replica, batch: int, context: float
) -> float:
    """Output tokens/s of steps that only decode ``batch`` sequences of ``context`` tokens."""
    return batch / step(device, eff, replica, decode_seqs=batch, context=context).total_s


@dataclass(frozen=True)
class OperatingPoint:
    """A replica at one concurrency (closed loop): latencies are means, not percentiles."""

    concurrency: int
    batch: int
    ttft_s: float
    tpot_s: float
    e2e_s: float
    queue_wait_s: float
    output_tokens_per_s: float
    requests_per_s: float
    mean_step: Step
    budget_bound: bool  # the token budget, not the output length, sets the steps per request


def operating_point(
    device: Device, eff: Efficiency, replica: Replica, prompt: int, output: int, concurrency: int
) -> OperatingPoint:
    """TTFT, TPOT and throughput of the replica with ``concurrency`` requests in flight."""
    if concurrency < 1:
        raise FrontierError(f"concurrency = {concurrency}: must be >= 1")
    b = min(concurrency, replica.max_batch_size)
    budget = replica.max_num_batched_tokens
    # Steps for one request's life in a full batch: one per output token, unless the budget cannot
    # carry b x (prompt + output) tokens in that many steps.
    steps = max(output, b * (prompt + output) / budget)
    context = prompt + output / 2  # mean context of a decoding sequence
    mean = step(
        device,
        eff,
        replica,
        decode_seqs=b * output / steps,
        context=context,
        prefill_tokens=b * prompt / steps,
        prefill_attended=prompt / 2,
        new_requests=b / steps,
    )
    tpot = mean.total_s * steps / output
    # A new request's prompt takes what the other b - 1 decodes leave of the budget, chunk by chunk.
    chunk = min(prompt, max(1, budget - (b - 1))) if replica.chunked_prefill else prompt
    chunks = math.ceil(prompt / chunk)
    first = step(
        device,
        eff,
        replica,
        decode_seqs=b - 1,
        context=context,
        prefill_tokens=chunk,
        prefill_attended=prompt / 2,
        new_requests=1 / chunks,
    )
    ttft_engine = chunks * first.total_s
    in_engine = ttft_engine + (output - 1) * tpot
    # Little's law: b slots each held for `in_engine` seconds; the other c - b requests queue.
    requests_per_s = b / in_engine
    wait = concurrency / requests_per_s - in_engine
    ttft = wait + ttft_engine
    return OperatingPoint(
        concurrency=concurrency,
        batch=b,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=ttft + (output - 1) * tpot,
        queue_wait_s=wait,
        output_tokens_per_s=requests_per_s * output,
        requests_per_s=requests_per_s,
        mean_step=mean,
        budget_bound=steps > output,
    )


def slo_violations(point: OperatingPoint, slo: Slo) -> list[str]:
    """The SLO fields the point breaks, each with its figure."""
    broken = []
    if point.ttft_s * 1000 > slo.ttft_ms:
        broken.append(f"slo.ttft_ms ({point.ttft_s * 1000:,.0f} > {slo.ttft_ms:g})")
    if point.tpot_s * 1000 > slo.tpot_ms:
        broken.append(f"slo.tpot_ms ({point.tpot_s * 1000:,.1f} > {slo.tpot_ms:g})")
    if point.e2e_s * 1000 > slo.p99_latency_ms:
        broken.append(f"slo.p99_latency_ms ({point.e2e_s * 1000:,.0f} > {slo.p99_latency_ms:g})")
    return broken


@dataclass(frozen=True)
class SloFit:
    """The replica's curve over concurrency 1..max_concurrency and its best point under the SLOs."""

    curve: tuple[OperatingPoint, ...]
    best: OperatingPoint | None  # the largest concurrency of the unbroken run from 1 meeting every SLO
    broken_at_1: tuple[str, ...]  # why even one request at a time fails, when it does

    @property
    def meets_slo(self) -> bool:
        return self.best is not None


def fit_slo(device: Device, eff: Efficiency, replica: Replica, slo: Slo, prompt: int, output: int) -> SloFit:
    curve = tuple(
        operating_point(device, eff, replica, prompt, output, c)
        for c in range(1, replica.max_concurrency + 1)
    )
    best = None
    for point in curve:
        if slo_violations(point, slo):
            break
        best = point
    broken = tuple(slo_violations(curve[0], slo)) if best is None else ()
    return SloFit(curve=curve, best=best, broken_at_1=broken)
