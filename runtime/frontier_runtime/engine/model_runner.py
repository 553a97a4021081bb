"""Runs the model over one scheduled step: builds the flat batch and the attention metadata, owns
the KV cache and the block-table tensor, returns the logits of the sequences that sample a token.

The step's inputs are a plain ``StepInput`` (lists of ints) so that under tensor parallelism rank 0
can send it to the other ranks and every rank builds identical tensors from it. Block tables are
not rebuilt per step: the block manager logs which cells changed and each rank applies just those
to its table tensor. Everything a step needs goes to the device in one copy; positions and slots
are derived there from the tables.

On CUDA with an attention backend whose steps read tensors only (its traits' ``graph_capturable``),
decode-only steps replay CUDA graphs captured at padded batch sizes over static buffers (``cuda_graphs``).

Under pipeline parallelism every rank gets the whole step and holds the KV cache of its own layers;
a stage's output goes to the same local rank of the next stage, and the last stage's logits back to
rank 0, the one that samples. The engine keeps a step per stage in flight (``launch`` now,
``collect`` later), each of its own sequences in one micro-batch, so every stage works on some step
while rank 0 samples and schedules; a step on its own may instead run as micro-batches
(``pipeline_chunks``) so that a stage starts on the next while the next stage works on the previous.

Every step only a CUDA device takes (memory queries, the host-to-device copy, graph capture and
replay) goes through the runner's ``DeviceOps``, chosen by the device; a test injects its own to
run a CUDA start's exact sequence (KV sizing, then graph capture) on CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import torch

from frontier_runtime import interconnect
from frontier_runtime.distributed import (
    Layout,
    Transfer,
    init_placement,
    receive_from,
    send_to,
    start_receive,
)
from frontier_runtime.engine.config import EngineConfig, resolve_dtype
from frontier_runtime.engine.sequence import Sequence
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.loader import load_model
from frontier_runtime.models.llama.model import DecoderLayer
from frontier_runtime.ops import cpu_kernel, panel_gemm, triton_fused
from frontier_runtime.ops.attention import AttentionMetadata, select_backend

log = logging.getLogger("frontier_runtime.engine")

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
FP8_MAX = 448.0


@dataclass
class StepInput:
    input_ids: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # block-table row of each sequence
    computed: list[int] = field(default_factory=list)  # tokens each sequence already has in the cache
    counts: list[int] = field(default_factory=list)  # its new tokens this step (decodes first: 1 each)
    num_decodes: int = 0
    table_updates: list[int] = field(default_factory=list)  # flat (row, column, block) triples
    logits_indices: list[int] = field(default_factory=list)
    # Micro-batches under pipeline parallelism; 0: ``ModelRunner.pipeline_chunks``' rule. Rank 0
    # decides so that every rank splits alike (1 when a step per stage is in flight).
    micro_batches: int = 0

    @property
    def is_decode_only(self) -> bool:
        return self.num_decodes == len(self.rows)

    def split(self, parts: int) -> list[StepInput]:
        """The step as ``parts`` micro-batches of consecutive sequences (as even as they divide), in
        order: their logits, concatenated, are the step's. The block-table updates go with the first."""
        if parts <= 1:
            return [self]
        base, extra = divmod(len(self.rows), parts)
        chunks, seq, token, logit = [], 0, 0, 0
        for i in range(parts):
            n = base + (i < extra)
            counts = self.counts[seq : seq + n]
            tokens = sum(counts)
            end = token + tokens
            indices = []
            while logit < len(self.logits_indices) and self.logits_indices[logit] < end:
                indices.append(self.logits_indices[logit] - token)
                logit += 1
            chunks.append(
                StepInput(
                    input_ids=self.input_ids[token:end],
                    rows=self.rows[seq : seq + n],
                    computed=self.computed[seq : seq + n],
                    counts=counts,
                    num_decodes=max(0, min(n, self.num_decodes - seq)),
                    table_updates=self.table_updates if i == 0 else [],
                    logits_indices=indices,
                )
            )
            seq, token = seq + n, end
        return chunks


class DeviceOps:
    """The device-specific steps of a start and of a step; this base is a CPU host's (no memory to
    measure, no graphs). A test subclasses it to stand in for a GPU."""

    sizes_kv_by_memory = False  # KV blocks from measured free memory, not ``cpu_kv_cache_bytes``
    captures_graphs = False  # replays decode steps of a graph-capturable attention backend

    def set_device(self, device: torch.device) -> None:
        pass

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return host.to(device)

    def synchronize(self, device: torch.device) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        pass

    def max_memory_allocated(self, device: torch.device) -> int:
        return 0

    def memory_reserved(self, device: torch.device) -> int:
        return 0

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        raise NotImplementedError("this device reports no free memory")

    def graph_pool(self) -> object:
        return None

    def capture(
        self, forward: Callable[[], torch.Tensor], pool: object
    ) -> tuple[Callable[[], object], torch.Tensor]:
        """Record ``forward`` (reading and writing only static buffers): a function that replays
        it, and the static tensor each replay leaves its output in. This base runs it eagerly."""
        out = forward()
        return lambda: out.copy_(forward()), out


class CudaOps(DeviceOps):
    sizes_kv_by_memory = True
    captures_graphs = True

    def set_device(self, device: torch.device) -> None:
        torch.cuda.set_device(device)

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return host.pin_memory().to(device, non_blocking=True)

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        torch.cuda.reset_peak_memory_stats(device)

    def max_memory_allocated(self, device: torch.device) -> int:
        return torch.cuda.max_memory_allocated(device)

    def memory_reserved(self, device: torch.device) -> int:
        return torch.cuda.memory_reserved(device)

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        return torch.cuda.mem_get_info(device)

    def graph_pool(self) -> object:
        return torch.cuda.graph_pool_handle()

    def capture(
        self, forward: Callable[[], torch.Tensor], pool: object
    ) -> tuple[Callable[[], object], torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        # ``pool`` is the handle this class's graph_pool() made.
        with torch.cuda.graph(graph, pool=cast("torch.cuda._POOL_HANDLE", pool)):
            out = forward()
        return graph.replay, out


def device_ops_for(device: torch.device) -> DeviceOps:
    return CudaOps() if device.type == "cuda" else DeviceOps()


def _kernels_in_use(device: torch.device) -> str:
    """What runs beside attention once the model is loaded (its layers chose their kernels then)."""
    if device.type == "cuda":
        return "triton-fused" if triton_fused.available(device) else "torch"
    if device.type != "cpu" or not cpu_kernel.enabled() or not cpu_kernel.loaded():
        return "torch"
    native = f"native-{cpu_kernel.variant()}"  # which prebuilt variant this CPU got
    return f"{native}+panel-gemm" if panel_gemm.available() else native


@dataclass
class Launched:
    """A step started by ``ModelRunner.launch``: its logits, or (rank 0 of a pipeline) the receives
    that bring them, and the sends this rank must see through before the tensors may go."""

    logits: torch.Tensor | None = None
    sent: list[Transfer] = field(default_factory=list)
    receiving: list[Transfer] = field(default_factory=list)


class ModelRunner:
    """One rank's model shard and KV cache; rank 0's also prepares each step's inputs."""

    def __init__(
        self, config: EngineConfig, rank: int = 0, init_method: str = "", ops: DeviceOps | None = None
    ) -> None:
        self.config = config
        cpu_kernel.use_native_kernels(config.native_kernels)  # before loading: layers choose kernels then
        # A rank takes the GPU of its index on its node (a replica may span several nodes).
        self.device = torch.device(
            config.device if config.device != "cuda" else f"cuda:{rank % config.ranks_per_node}"
        )
        self.ops = ops or device_ops_for(self.device)
        self.ops.set_device(self.device)
        layout = Layout(
            config.tensor_parallel_size, config.expert_parallel_size, config.pipeline_parallel_size
        )
        self.placement = init_placement(
            rank, layout, init_method, self.device, config.process_group_timeout_s
        )
        # Before the weights: a replica whose links are too slow is refused before it loads.
        try:
            self.interconnect = (
                interconnect.check(self.device, config.min_bus_gbps) if layout.world_size > 1 else None
            )
        except BaseException:
            # A refused rank leaves the group: an engine made later in this process joins a new one
            # rather than the one whose peers are gone.
            self.placement.destroy()
            raise
        if self.interconnect is not None and rank == 0:
            log.info("%s", self.interconnect)
        self.tp = self.placement.tp
        self.pipelined = layout.pipeline_parallel > 1
        self.dtype = DTYPES[resolve_dtype(config)]
        self.kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else DTYPES[config.kv_cache_dtype]
        self.block_size = config.block_size
        self.model = load_model(
            config.model_dir,
            self.dtype,
            self.device,
            placement=self.placement,
            quantization=config.quantization,
        )
        self.model_config: LlamaConfig = self.model.cfg
        cfg = self.model_config
        self.max_seq_len = config.max_seq_len or cfg.max_position_embeddings
        self.max_blocks_per_seq = -(-self.max_seq_len // self.block_size)
        self.backend = select_backend(
            self.device,
            self.block_size,
            self.dtype,
            config.attention_backend,
            self.kv_dtype,
            window=cfg.sliding_window or 0,
        )
        if self.kv_dtype == torch.float8_e4m3fn:
            self._set_fp8_scales()
        self.kernels = _kernels_in_use(self.device)
        log.info(
            "attention backend %s, kernels %s, KV cache %s", self.backend.name, self.kernels, self.kv_dtype
        )
        kv_per_token = 2 * len(self.model.layers) * self.model.num_local_kv_heads * cfg.head_dim
        self.bytes_per_block = kv_per_token * self.block_size * self.kv_dtype.itemsize
        self.tables = torch.zeros(
            max(config.max_batch_size, 1), self.max_blocks_per_seq, dtype=torch.int32, device=self.device
        )
        # Empty until capture: sizing runs the worst step through ``execute``, which reads it.
        self.graphs: dict[int, _DecodeGraph] = {}
        num_blocks = config.num_blocks
        if num_blocks is None:
            if self.ops.sizes_kv_by_memory:
                num_blocks = self._device_blocks(config.gpu_memory_utilization)
            else:
                num_blocks = config.cpu_kv_cache_bytes // self.bytes_per_block
            num_blocks = self.placement.world.min_over_ranks(num_blocks, self.device)  # every rank must agree
        self.num_blocks = num_blocks
        # One block more than the engine hands out: padded rows of a CUDA graph write and read it.
        self.scratch_block = num_blocks
        self.kv_caches = self._allocate(num_blocks + 1)
        if self.use_cuda_graphs:
            self._capture_graphs()

    @property
    def use_cuda_graphs(self) -> bool:
        return (
            self.config.cuda_graphs
            and self.ops.captures_graphs
            and self.backend.traits.graph_capturable
            and not self.placement.world.enabled  # NCCL inside captured graphs is left for later
        )

    def _set_fp8_scales(self) -> None:
        for module in self.model.layers:
            layer = cast(DecoderLayer, module)
            k_bound, v_bound = layer.self_attn.kv_bound(layer.input_layernorm.weight)
            layer.self_attn.k_scale = max(k_bound, 1e-6) / FP8_MAX
            layer.self_attn.v_scale = max(v_bound, 1e-6) / FP8_MAX

    def _allocate(self, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.model_config
        kvh = self.model.num_local_kv_heads
        return [
            self.backend.allocate_kv(
                num_blocks, self.block_size, kvh, cfg.head_dim, self.kv_dtype, self.device
            )
            for _ in self.model.layers
        ]

    # -- sizing ---------------------------------------------------------------------------------

    def worst_step(self) -> StepInput:
        """The step that needs the most activation memory: ``max_batch_size`` sequences at full
        context, as many decodes as the token budget leaves room for beside one prefill chunk that
        takes the rest of ``max_num_batched_tokens``, every one sampling. All tables point at the
        same blocks (``ceil(max_seq_len / block_size)`` of them): what is read does not matter."""
        c = self.config
        budget = max(1, c.max_num_batched_tokens)
        decodes = min(c.max_batch_size - 1, budget - 1)
        chunk = min(budget - decodes, self.max_seq_len)
        step = StepInput(num_decodes=decodes)
        for i in range(decodes + 1):
            n = 1 if i < decodes else chunk
            step.rows.append(0)
            step.computed.append(self.max_seq_len - n)
            step.counts.append(n)
            step.input_ids.extend([0] * n)
            step.logits_indices.append(len(step.input_ids) - 1)
        for col in range(self.max_blocks_per_seq):
            step.table_updates.extend((0, col, col))
        return step

    def profile_worst_step(self) -> None:
        """Run ``worst_step`` on a cache just big enough for it, then put back the cache and the
        tables there were before (none yet, when sizing at start)."""
        saved_caches = getattr(self, "kv_caches", None)
        saved_tables = self.tables.clone()
        self.kv_caches = self._allocate(self.max_blocks_per_seq)
        try:
            self.execute(self.worst_step())
        finally:
            if saved_caches is None:
                del self.kv_caches
            else:
                self.kv_caches = saved_caches
            self.tables.copy_(saved_tables)

    def _device_blocks(self, utilization: float) -> int:
        """KV blocks that fit in ``utilization`` of the GPU after weights and the worst step."""
        ops, dev = self.ops, self.device
        ops.empty_cache()
        ops.reset_peak_memory_stats(dev)
        self.profile_worst_step()
        ops.synchronize(dev)
        probe = self.max_blocks_per_seq * self.bytes_per_block
        peak = ops.max_memory_allocated(dev) - probe
        ops.empty_cache()
        free, total = ops.mem_get_info(dev)
        other = total - free - ops.memory_reserved(dev)  # other processes, CUDA context
        budget = int(total * utilization) - peak - other - self._graph_reserve()
        return max(budget // self.bytes_per_block - 1, 0)  # - 1: the scratch block

    def _graph_reserve(self) -> int:
        """Room for the CUDA graphs' memory pool: about one decode step at the largest size."""
        if not self.use_cuda_graphs:
            return 0
        cfg = self.model_config
        per_token = 4 * (cfg.hidden_size * 4 + cfg.intermediate_size * 3)  # activations, generously
        return self.config.max_batch_size * per_token + (64 << 20)

    # -- one step -------------------------------------------------------------------------------

    def prepare(
        self, scheduled: list[tuple[Sequence, int]], rows: dict[Sequence, int], table_updates: list[int]
    ) -> tuple[StepInput, list[Sequence]]:
        """The step's inputs, and the sequences (in logits order) that sample a token this step."""
        step = StepInput(table_updates=table_updates)
        ordered = [x for x in scheduled if x[1] == 1] + [x for x in scheduled if x[1] != 1]
        step.num_decodes = len(ordered) - sum(1 for _, n in scheduled if n != 1)
        samplers: list[Sequence] = []
        ids = step.input_ids
        for seq, n in ordered:
            before = seq.num_computed_tokens
            step.rows.append(rows[seq])
            step.computed.append(before)
            step.counts.append(n)
            if n == 1:
                ids.append(seq.token_ids[before])
            else:
                ids.extend(seq.token_ids[before : before + n])
            if before + n == seq.num_tokens:
                step.logits_indices.append(len(ids) - 1)
                samplers.append(seq)
        return step, samplers

    def _apply_table_updates(self, updates: torch.Tensor) -> None:
        upd = updates.view(-1, 3)
        top = int(upd[:, 0].max()) + 1 if self.device.type == "cpu" else 0
        if top > self.tables.shape[0]:  # more live sequences than max_batch_size (standalone use)
            grown = torch.zeros(top, self.tables.shape[1], dtype=torch.int32, device=self.device)
            grown[: self.tables.shape[0]] = self.tables
            self.tables = grown
        self.tables[upd[:, 0], upd[:, 1]] = upd[:, 2].to(torch.int32)

    def _metadata(
        self, step: StepInput
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """input ids, positions, attention metadata and logits rows, from one host-to-device copy."""
        dev, bs = self.device, self.block_size
        t, s, n_logits = len(step.input_ids), len(step.rows), len(step.logits_indices)
        host = torch.tensor(
            step.input_ids
            + step.rows
            + step.computed
            + step.counts
            + step.logits_indices
            + step.table_updates,
            dtype=torch.int64,
        )
        packed = self.ops.to_device(host, dev)
        ids, rows, computed, counts, logit_rows, updates = torch.split(
            packed, [t, s, s, s, n_logits, len(step.table_updates)]
        )
        if step.table_updates:
            self._apply_table_updates(updates)
        seq_lens = computed + counts
        query_start = torch.zeros(s + 1, dtype=torch.int64, device=dev)
        if step.is_decode_only:
            positions = computed
            query_start[1:] = torch.arange(1, s + 1, device=dev)
            token_rows = rows
        else:
            torch.cumsum(counts, 0, out=query_start[1:])
            seq_of_token = torch.repeat_interleave(torch.arange(s, device=dev), counts, output_size=t)
            positions = computed[seq_of_token] + torch.arange(t, device=dev) - query_start[seq_of_token]
            token_rows = rows[seq_of_token]
        slots = self.tables[token_rows, positions // bs].long() * bs + positions % bs
        rows32 = rows.to(torch.int32)
        seq_lens32 = seq_lens.to(torch.int32)
        host_seq_lens = [c + n for c, n in zip(step.computed, step.counts, strict=True)]
        meta = AttentionMetadata(
            slots=slots,
            tables=self.tables,
            rows=rows32,
            query_start=query_start.to(torch.int32),
            seq_lens=seq_lens32,
            num_decodes=step.num_decodes,
            max_query_len=max(step.counts),
            max_seq_len=max(host_seq_lens),
            backend=self.backend,
        )
        self.backend.complete_metadata(meta, step.counts, host_seq_lens)
        return ids, positions, meta, logit_rows

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """Run the step on this rank's shard; the logits of ``step.logits_indices``, float32."""
        return self.collect(self.launch(step))

    @torch.inference_mode()
    def launch(self, step: StepInput) -> Launched:
        """Start the step: all of it, except under pipeline parallelism, where this rank does its
        stage's part and the rest travels on (rank 0 may launch the next step before ``collect``)."""
        if self.graphs and step.is_decode_only and len(step.rows) <= max(self.graphs):
            return Launched(logits=self._replay(step))
        if self.pipelined:
            return self._launch_pipelined(step)
        ids, positions, meta, logit_rows = self._metadata(step)
        hidden = self.model(ids, positions, meta, self.kv_caches)
        if not step.logits_indices:
            return Launched(logits=hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32))
        return Launched(logits=self.model.compute_logits(hidden.index_select(0, logit_rows)))

    def collect(self, launched: Launched) -> torch.Tensor:
        """The launched step's logits (on rank 0 of a pipeline: once the last stage sent them)."""
        for sending in launched.sent:
            sending.wait()
        if launched.logits is not None:
            return launched.logits
        for receiving in launched.receiving:
            receiving.wait()
        parts = [r.tensor for r in launched.receiving]
        vocab = self.model_config.vocab_size
        return torch.cat(parts) if parts else torch.empty((0, vocab), dtype=torch.float32, device=self.device)

    # -- pipeline parallelism -------------------------------------------------------------------

    def _launch_pipelined(self, step: StepInput) -> Launched:
        """This rank's stage over the step's micro-batches; rank 0 also posts the receives of the
        step's logits from the last stage, which ``collect`` waits for."""
        p = self.placement
        stage, stages = p.pipeline_stage, p.layout.pipeline_parallel
        hidden = self.model_config.hidden_size
        chunks = step.split(self.pipeline_chunks(step))
        sent: list[Transfer] = []
        for chunk in chunks:
            ids, positions, meta, logit_rows = self._metadata(chunk)
            if p.is_first_stage:
                inputs = ids
            else:
                shape = (2, len(chunk.input_ids), hidden)
                inputs = receive_from(p.peer_in_stage(stage - 1), shape, self.dtype, self.device)
            out = self.model.forward_stage(inputs, positions, meta, self.kv_caches)
            if not p.is_last_stage:
                # Not waited for here: this stage goes on to the next micro-batch while it travels.
                sent.append(send_to(out, p.peer_in_stage(stage + 1)))
            elif p.peer_in_stage(0) == 0 and chunk.logits_indices:  # the last stage's rank beside rank 0
                sent.append(send_to(self.model.compute_logits(out.index_select(0, logit_rows)), 0))
        vocab = self.model_config.vocab_size
        if p.rank != 0:
            return Launched(
                logits=torch.empty((0, vocab), dtype=torch.float32, device=self.device), sent=sent
            )
        last = p.peer_in_stage(stages - 1)
        receiving = [
            start_receive(last, (len(c.logits_indices), vocab), torch.float32, self.device)
            for c in chunks
            if c.logits_indices
        ]
        return Launched(sent=sent, receiving=receiving)

    def pipeline_chunks(self, step: StepInput) -> int:
        """Micro-batches of a step: as rank 0 set them, else two per stage so each stage has the next
        one ready, never more than the step's sequences (one sequence's tokens stay in one)."""
        if step.micro_batches:
            return min(step.micro_batches, max(1, len(step.rows)))
        return max(1, min(2 * self.placement.layout.pipeline_parallel, len(step.rows)))

    # -- CUDA graphs ----------------------------------------------------------------------------

    def graph_sizes(self) -> list[int]:
        """Padded decode batch sizes a graph is captured for: 1, 2, 4, 8, then every 16."""
        top = self.config.max_batch_size
        sizes = [b for b in (1, 2, 4, 8) if b < top] + list(range(16, top, 16)) + [top]
        return sorted(set(sizes))

    def _capture_graphs(self) -> None:
        sizes = self.graph_sizes()
        top = sizes[-1]
        dev = self.device
        static = _DecodeGraph.buffers(top, self.max_blocks_per_seq, dev)
        pool = self.ops.graph_pool()
        for size in reversed(sizes):  # largest first: smaller ones reuse its pool
            graph = _DecodeGraph(self, size, static, pool)
            self.graphs[size] = graph
        self.ops.synchronize(dev)
        log.info("captured decode graphs for batches of %s", sizes)

    def _replay(self, step: StepInput) -> torch.Tensor:
        s = len(step.rows)
        size = next(b for b in sorted(self.graphs) if b >= s)
        graph = self.graphs[size]
        host = torch.tensor(
            step.input_ids + step.rows + step.computed + step.logits_indices + step.table_updates,
            dtype=torch.int64,
        )
        packed = self.ops.to_device(host, self.device)
        ids, rows, computed, logit_rows, updates = torch.split(
            packed, [s, s, s, len(step.logits_indices), len(step.table_updates)]
        )
        if step.table_updates:
            self._apply_table_updates(updates)
        hidden = graph.replay(self, ids, rows, computed)
        # Not every one-token step samples: a prompt chunk of one token may stop short of its end.
        return self.model.compute_logits(hidden.index_select(0, logit_rows))

    def shutdown(self) -> None:
        self.placement.destroy()


class _DecodeGraph:
    """One captured decode step at a padded batch size, over buffers shared by all sizes.

    Padded rows decode one token of a pretend sequence whose only block is the scratch block, so
    they write nowhere the engine uses."""

    def __init__(self, runner: ModelRunner, size: int, static: dict[str, torch.Tensor], pool: object) -> None:
        self.size = size
        self.static = static
        bs = runner.block_size
        st = {
            k: v[:size] if k not in ("query_start", "cu_seq_k") else v[: size + 1] for k, v in static.items()
        }
        self.views = st
        self.meta = AttentionMetadata(
            slots=st["slots"],
            tables=runner.tables,
            rows=st["rows"],
            query_start=st["query_start"],
            seq_lens=st["seq_lens"],
            num_decodes=size,
            max_query_len=1,
            max_seq_len=runner.max_seq_len,
            backend=runner.backend,
            step_tables=st["step_tables"],
            cu_seq_k=st["cu_seq_k"],
        )
        st["step_tables"].fill_(runner.scratch_block)
        st["seq_lens"].fill_(1)
        st["slots"].fill_(runner.scratch_block * bs)
        st["positions"].zero_()
        torch.cumsum(st["seq_lens"], 0, out=st["cu_seq_k"][1:])
        for _ in range(2):  # warm up outside the graph (allocator, lazy init)
            runner.model(st["ids"], st["positions"], self.meta, runner.kv_caches)
        runner.ops.synchronize(runner.device)
        self.run, self.hidden = runner.ops.capture(
            lambda: runner.model(st["ids"], st["positions"], self.meta, runner.kv_caches), pool
        )

    @staticmethod
    def buffers(top: int, max_blocks: int, dev: torch.device) -> dict[str, torch.Tensor]:
        i32 = torch.int32
        return {
            "ids": torch.zeros(top, dtype=torch.long, device=dev),
            "positions": torch.zeros(top, dtype=torch.long, device=dev),
            "slots": torch.zeros(top, dtype=torch.long, device=dev),
            "rows": torch.zeros(top, dtype=i32, device=dev),
            "seq_lens": torch.ones(top, dtype=i32, device=dev),
            "query_start": torch.arange(top + 1, dtype=i32, device=dev),
            "cu_seq_k": torch.zeros(top + 1, dtype=i32, device=dev),
            "step_tables": torch.zeros(top, max_blocks, dtype=i32, device=dev),
        }

    def replay(
        self, runner: ModelRunner, ids: torch.Tensor, rows: torch.Tensor, computed: torch.Tensor
    ) -> torch.Tensor:
        s, st, bs = ids.shape[0], self.views, runner.block_size
        st["ids"][:s].copy_(ids)
        st["positions"][:s].copy_(computed)
        st["rows"][:s].copy_(rows)  # backends that read ``tables`` by row, not ``step_tables``
        tables = runner.tables.index_select(0, rows)
        st["step_tables"][:s].copy_(tables)
        st["slots"][:s].copy_(
            tables.gather(1, (computed // bs).unsqueeze(1)).squeeze(1).long() * bs + computed % bs
        )
        st["seq_lens"][:s].copy_(computed + 1)
        # Padded rows keep their scratch values from capture (seq_len 1, scratch block).
        st["seq_lens"][s:].fill_(1)
        st["step_tables"][s:].fill_(runner.scratch_block)
        st["slots"][s:].fill_(runner.scratch_block * bs)
        st["ids"][s:].zero_()
        st["positions"][s:].zero_()
        torch.cumsum(st["seq_lens"], 0, out=st["cu_seq_k"][1:])
        self.run()
        return self.hidden[:s]
