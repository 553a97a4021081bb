"""Runs the model over one scheduled step: builds the flat batch and the attention metadata, owns
the KV cache tensors, returns the logits of the sequences that sample a token this step.

The step's inputs are a plain ``StepInput`` (lists of ints) so that under tensor parallelism rank 0
can send it to the other ranks and every rank builds identical tensors from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from frontier_runtime.distributed import init_group
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.sequence import Sequence
from frontier_runtime.models.llama.attention import AttentionMetadata, DecodeGroup, PrefillChunk
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.loader import load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class StepInput:
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # block * block_size + offset of each token
    # Decodes come first: those whose blocks are consecutive (attended in place), then the others,
    # shortest first, whose blocks are gathered.
    decode_spans: list[tuple[int, int]] = field(default_factory=list)  # (first block, context)
    decode_tables: list[list[int]] = field(default_factory=list)
    decode_context: list[int] = field(default_factory=list)  # tokens each decode attends to
    decode_groups: list[tuple[int, int]] = field(default_factory=list)  # (start, count), padded together
    prefills: list[tuple[int, int, int, list[int]]] = field(
        default_factory=list
    )  # start, len, before, blocks
    logits_indices: list[int] = field(default_factory=list)


def group_by_length(block_counts: list[int], slack: float = 1.25) -> list[tuple[int, int]]:
    """Split ascending block counts into runs padded together, each padded to at most ``slack`` x
    its real size plus one block, so one long context does not make every short one pay for it."""
    groups: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, blocks in enumerate(block_counts):
        if i > start and blocks * (i + 1 - start) > slack * (total + blocks) + blocks:
            groups.append((start, i - start))
            start, total = i, 0
        total += blocks
    if block_counts:
        groups.append((start, len(block_counts) - start))
    return groups


class ModelRunner:
    """One rank's model shard and KV cache; rank 0's also prepares each step's inputs."""

    def __init__(self, config: EngineConfig, rank: int = 0, init_method: str = "") -> None:
        self.config = config
        self.device = torch.device(config.device if config.device != "cuda" else f"cuda:{rank}")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.tp = init_group(rank, config.tensor_parallel_size, init_method, self.device)
        self.dtype = DTYPES[config.dtype]
        self.kv_dtype = self.dtype if config.kv_cache_dtype == "auto" else DTYPES[config.kv_cache_dtype]
        self.block_size = config.block_size
        self.model = load_model(config.model_dir, self.dtype, self.device, self.tp)
        self.model_config: LlamaConfig = self.model.cfg
        cfg = self.model_config
        kv_per_token = 2 * cfg.num_layers * self.model.num_local_kv_heads * cfg.head_dim
        self.bytes_per_block = kv_per_token * self.block_size * self.kv_dtype.itemsize
        num_blocks = config.num_blocks
        if num_blocks is None:
            if self.device.type == "cuda":
                num_blocks = self._cuda_blocks(config.gpu_memory_utilization, config.max_num_batched_tokens)
            else:
                num_blocks = config.cpu_kv_cache_bytes // self.bytes_per_block
            num_blocks = self.tp.min_over_ranks(num_blocks, self.device)  # every rank must agree
        self.num_blocks = num_blocks
        self.kv_caches = self._allocate(num_blocks)

    def _allocate(self, num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (self.model.num_local_kv_heads, num_blocks, self.block_size, self.model_config.head_dim)
        # Zeros, not empty: padded reads are masked, but garbage NaNs would still poison softmax @ V.
        return [
            (
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
            )
            for _ in range(self.model_config.num_layers)
        ]

    def _cuda_blocks(self, utilization: float, max_tokens: int) -> int:
        """KV blocks that fit in ``utilization`` of the GPU after weights and a peak-sized step."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        max_tokens = min(max_tokens, self.model_config.max_position_embeddings)
        probe_blocks = -(-max_tokens // self.block_size)
        self.kv_caches = self._allocate(probe_blocks)
        with torch.inference_mode():
            step = StepInput(
                input_ids=[0] * max_tokens,
                positions=list(range(max_tokens)),
                slots=list(range(max_tokens)),
                prefills=[(0, max_tokens, 0, [])],
                logits_indices=[max_tokens - 1],
            )
            self.execute(step)
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - probe_blocks * self.bytes_per_block
        del self.kv_caches
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        other = total - free - torch.cuda.memory_reserved(self.device)  # other processes, CUDA context
        budget = int(total * utilization) - peak - other
        return max(budget // self.bytes_per_block, 0)

    # -- one step -------------------------------------------------------------------------------

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> tuple[StepInput, list[Sequence]]:
        """The step's inputs, and the sequences (in logits order) that sample a token this step."""
        step = StepInput()
        bs = self.block_size
        in_place: list[Sequence] = []
        gathered: list[Sequence] = []
        for seq, n in scheduled:
            if n == 1:
                table, used = seq.block_table, seq.num_computed_tokens // bs + 1
                first = table[0]
                consecutive = (
                    self.device.type == "cpu"  # on a GPU one batched gather beats a kernel per sequence
                    and table[used - 1] - first == used - 1
                    and table[:used] == list(range(first, first + used))
                )
                (in_place if consecutive else gathered).append(seq)
        gathered.sort(key=lambda s: s.num_computed_tokens)
        prefills = [(s, n) for s, n in scheduled if n > 1]
        samplers: list[Sequence] = []
        for seq in in_place + gathered:
            pos = seq.num_computed_tokens
            table = seq.block_table
            step.input_ids.append(seq.token_ids[pos])
            step.positions.append(pos)
            step.slots.append(table[pos // bs] * bs + pos % bs)
            if len(step.decode_spans) < len(in_place):
                step.decode_spans.append((table[0], pos + 1))
            else:
                step.decode_tables.append(table[: pos // bs + 1])
                step.decode_context.append(pos + 1)
            if pos + 1 == seq.num_tokens:
                step.logits_indices.append(len(step.input_ids) - 1)
                samplers.append(seq)
        step.decode_groups = group_by_length([len(t) for t in step.decode_tables])
        for seq, n in prefills:
            start, before = len(step.input_ids), seq.num_computed_tokens
            table = seq.block_table
            step.input_ids.extend(seq.token_ids[before : before + n])
            step.positions.extend(range(before, before + n))
            step.slots.extend(table[p // bs] * bs + p % bs for p in range(before, before + n))
            step.prefills.append((start, n, before, table[: -(-(before + n) // bs)] if before else []))
            if before + n == seq.num_tokens:
                step.logits_indices.append(len(step.input_ids) - 1)
                samplers.append(seq)
        return step, samplers

    @torch.inference_mode()
    def execute(self, step: StepInput) -> torch.Tensor:
        """Run the step on this rank's shard; the logits of ``step.logits_indices``, float32."""
        dev, bs = self.device, self.block_size
        kvh = self.model.num_local_kv_heads
        nb = self.kv_caches[0][0].shape[1]  # also right for the probe cache of _cuda_blocks
        heads = torch.arange(kvh)
        head_rows = heads * nb  # first tile row of each head in the [kv_heads * num_blocks, ...] view
        ids = torch.tensor(step.input_ids, dtype=torch.long).to(dev, non_blocking=True)
        positions = torch.tensor(step.positions, dtype=torch.long).to(dev, non_blocking=True)
        slots = torch.tensor(step.slots, dtype=torch.long)
        # Row of each (token, kv head) in the flat [kv_heads * num_blocks * block_size, head_dim] view.
        write = head_rows * bs + slots.unsqueeze(1)
        meta = AttentionMetadata(write_index=write.view(-1).to(dev, non_blocking=True))
        meta.decode_spans = [(first * bs, context) for first, context in step.decode_spans]
        offset = len(step.decode_spans)
        for start, count in step.decode_groups:
            tables = step.decode_tables[start : start + count]
            width = len(tables[-1])  # shortest first: the last is the longest
            padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
            head_blocks = (padded.unsqueeze(1) + head_rows.view(1, kvh, 1)).view(-1)
            context = torch.tensor(step.decode_context[start : start + count], dtype=torch.long)
            mask = None
            if int(context.min()) < width * bs:
                mask = (torch.arange(width * bs).unsqueeze(0) < context.unsqueeze(1)).view(
                    count, 1, 1, width * bs
                )
                mask = mask.to(dev, non_blocking=True)
            meta.decode_groups.append(
                DecodeGroup(offset + start, count, head_blocks.to(dev, non_blocking=True), mask)
            )
        for start, length, before, blocks in step.prefills:
            head_blocks = mask = None
            if before:
                table = torch.tensor(blocks, dtype=torch.long)
                head_blocks = (
                    (table.unsqueeze(0) + head_rows.unsqueeze(1)).view(-1).to(dev, non_blocking=True)
                )
                keys = torch.arange(before + length).unsqueeze(0)
                mask = (keys <= torch.arange(before, before + length).unsqueeze(1)).to(dev, non_blocking=True)
            meta.prefills.append(PrefillChunk(start, length, before, head_blocks, mask))
        hidden = self.model(ids, positions, meta, self.kv_caches)
        if not step.logits_indices:
            return hidden.new_empty((0, self.model_config.vocab_size), dtype=torch.float32)
        rows = torch.tensor(step.logits_indices, dtype=torch.long).to(dev, non_blocking=True)
        return self.model.compute_logits(hidden.index_select(0, rows))

    def shutdown(self) -> None:
        self.tp.destroy()
