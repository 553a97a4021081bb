"""A Llama-family decoder (Llama 2/3, Qwen2/Qwen3, Mistral, Mixtral, Qwen2/3-MoE) over a paged KV cache.

RMSNorm, rotary embeddings (default, linear or llama3 scaling), grouped-query attention (Qwen3:
RMSNorm on each q and k head), SwiGLU MLP or a sparse mixture of SwiGLU experts (``moe``),
optional tied embeddings. Under tensor parallelism each rank holds its heads and MLP slice;
the row-parallel projections all-reduce their partial sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from frontier_runtime.distributed import SINGLE, TPGroup
from frontier_runtime.models.llama.attention import Attention, AttentionMetadata, Rope
from frontier_runtime.models.llama.config import LlamaConfig, check_tensor_parallel
from frontier_runtime.models.llama.layers import MLP, Linear, RMSNorm
from frontier_runtime.models.llama.moe import SparseMoE


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp: TPGroup, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Chosen once here, so the forward below is the same for dense and sparse layers.
        self.mlp: MLP | SparseMoE = SparseMoE(cfg, tp) if index in cfg.sparse_layers else MLP(cfg, tp)

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
    def __init__(self, cfg: LlamaConfig, tp: TPGroup = SINGLE) -> None:
        super().__init__()
        check_tensor_parallel(cfg, tp.world_size)
        self.cfg = cfg
        self.tp = tp
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Embedding and LM head stay whole on every rank: every rank then holds the full logits.
        self.lm_head = (
            None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    @property
    def num_local_kv_heads(self) -> int:
        return self.cfg.num_kv_heads // self.tp.world_size

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = Rope(positions, self.rope_cos, self.rope_sin)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, meta, k_cache, v_cache)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()
