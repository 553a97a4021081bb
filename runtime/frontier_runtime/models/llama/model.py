"""A Llama-family decoder (Llama 2/3, Qwen2/Qwen3, Mistral, Mixtral, Qwen2/3-MoE) over a paged KV cache.

RMSNorm, rotary embeddings (default, linear or llama3 scaling), grouped-query attention (Qwen3:
RMSNorm on each q and k head), SwiGLU MLP or a sparse mixture of SwiGLU experts (``moe``),
optional tied embeddings. Under tensor parallelism each rank holds its heads and MLP slice;
the row-parallel projections all-reduce their partial sums. Under expert parallelism each rank
holds its shard of the experts (``moe``). Under pipeline parallelism each rank holds the
contiguous layers of its stage: the first stage the embedding, the last the final norm and the LM
head (and the embedding too when the head is tied to it); ``forward_stage`` runs one stage.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from frontier_runtime.distributed import SINGLE, Layout, Placement, TPGroup
from frontier_runtime.models.llama.attention import Attention, AttentionMetadata, Rope
from frontier_runtime.models.llama.config import LlamaConfig, check_tensor_parallel
from frontier_runtime.models.llama.layers import MLP, Linear, RMSNorm
from frontier_runtime.models.llama.moe import SparseMoE


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, placement: Placement, index: int) -> None:
        super().__init__()
        tp = placement.tp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, tp, window=cfg.window_of(index))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Chosen once here, so the forward below is the same for dense and sparse layers.
        self.mlp: MLP | SparseMoE = SparseMoE(cfg, placement) if index in cfg.sparse_layers else MLP(cfg, tp)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: Rope,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` is the previous layer's output, not yet added to ``residual`` (the stream): each
        norm adds it and normalises in one pass. Returns this layer's output and the stream."""
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, rope, meta, k_cache, v_cache)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp: TPGroup = SINGLE, placement: Placement | None = None) -> None:
        """``placement``: this rank's place under expert/pipeline parallelism; without it, tensor
        parallelism alone over ``tp``."""
        super().__init__()
        placement = placement or Placement.of_tensor_parallel(tp)
        check_parallel(cfg, placement.layout)
        self.cfg = cfg
        self.placement = placement
        self.tp = placement.tp
        first, last = placement.is_first_stage, placement.is_last_stage
        self.layer_ids = placement.layout.stage_layers(cfg.num_layers, placement.pipeline_stage)
        # Embedding and LM head stay whole on every rank that holds them: every rank of the last
        # stage then holds the full logits.
        holds_embedding = first or (last and cfg.tie_word_embeddings)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if holds_embedding else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, placement, i) for i in self.layer_ids)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if last else None
        self.lm_head = (
            Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            if last and not cfg.tie_word_embeddings
            else None
        )
        if self.lm_head is not None:
            self.lm_head.float_out = True  # the logits, in float32 where the GEMM can leave them so
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    @property
    def num_local_kv_heads(self) -> int:
        return self.cfg.num_kv_heads // self.tp.world_size

    def unfilled(self) -> list[str]:
        """The parameters and buffers that no loaded tensor filled (still on the meta device). Names
        only: a list of the tensors would keep every weight alive through what the loader does next."""
        return [name for name, t in (*self.named_parameters(), *self.named_buffers()) if t.is_meta]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """The whole model (one pipeline stage): the final hidden states of every token."""
        x = self.embed_tokens(input_ids)
        rope = Rope(positions, self.rope_cos, self.rope_sin)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, meta, k_cache, v_cache)
        return self.norm(x, residual)[0]

    def forward_stage(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """One pipeline stage. The first takes the token ids, the others the previous stage's output;
        the last returns the final hidden states, the others ``[2, tokens, hidden]``: the last layer's
        output and the residual stream, both of which the next layer's norm reads."""
        if self.embed_tokens is not None and self.placement.is_first_stage:
            x, residual = self.embed_tokens(inputs), None
        else:
            x, residual = inputs[0], inputs[1]  # the received buffer: the norm may add into it
        rope = Rope(positions, self.rope_cos, self.rope_sin)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, meta, k_cache, v_cache)
        if self.norm is not None:
            return self.norm(x, residual)[0]
        return torch.stack((x, residual))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()


def check_parallel(cfg: LlamaConfig, layout: Layout) -> None:
    """Refuse parallel sizes the model's shape does not split into, naming both numbers."""
    tp, ep = layout.tensor_parallel, layout.expert_parallel
    layout.stage_layers(cfg.num_layers, 0)  # refuses more stages than layers
    if ep == 1:
        check_tensor_parallel(cfg, tp)
        return
    if not cfg.num_experts:
        raise ValueError(
            f"parallel.expert_parallel_size {ep}: model_type {cfg.model_type!r} is dense (no experts); "
            "expert parallelism needs a mixture-of-experts model (num_experts > 0)"
        )
    if ep > cfg.num_experts or cfg.num_experts % ep:
        raise ValueError(
            f"parallel.expert_parallel_size {ep} must divide the model's {cfg.num_experts} experts "
            f"(num_experts) into equal shards: 1..{cfg.num_experts}, a divisor of {cfg.num_experts}"
        )
    # Attention and dense MLPs split over TP; experts whole per EP shard, their columns over G / EP.
    check_tensor_parallel(dataclasses.replace(cfg, num_experts=0, shared_expert_intermediate_size=0), tp)
    columns = layout.stage_size // ep
    sizes = [("the experts' intermediate size", cfg.moe_intermediate_size, columns)]
    if cfg.shared_expert_intermediate_size:
        sizes.append(
            ("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, layout.stage_size)
        )
    for name, value, ranks in sizes:
        if value % ranks:
            raise ValueError(
                f"parallel.tensor_parallel_size {tp} x expert_parallel_size {ep}: {name} {value} must split "
                f"over the {ranks} ranks that share it"
            )
