"""The sparse MLP of Mixtral, Qwen2-MoE and Qwen3-MoE: a router picks each token's top-k experts.

Routing follows transformers: softmax over the router's logits in float32, the top-k
probabilities (renormalised to sum to 1 where ``norm_topk_prob`` says so, as Mixtral always does)
weight the chosen experts' SwiGLU outputs. Qwen2-MoE adds a shared expert that every token
passes through, scaled by ``sigmoid(shared_expert_gate(x))``.

A step's tokens are grouped by expert (one argsort of the token-expert pairs), so each expert
runs one GEMM over all of its tokens, and the weighted rows are summed back into their tokens with
one ``index_add_``. Under tensor parallelism every rank holds all experts, each split along its
intermediate dimension like the dense MLP (gate/up column-parallel, down row-parallel); the router
is whole on every rank, so all ranks route alike, and the routed and shared partial sums are
all-reduced once.
"""

from __future__ import annotations

import torch
from torch import nn

from frontier_runtime.distributed import TPGroup
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import Linear
from frontier_runtime.ops import fused


class Expert(nn.Module):
    """One SwiGLU expert's slice on this rank; its output is a partial sum the caller all-reduces."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused.silu_and_mul(self.gate_up_proj(x)))


class SparseMoE(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.renormalize = cfg.norm_topk_prob
        # nn.Linear, not the packed Linear: the router's few outputs are computed as transformers
        # does, so near-equal logits pick the same experts.
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        inter = cfg.moe_intermediate_size // tp.world_size
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, inter) for _ in range(cfg.num_experts))
        self.shared_expert: Expert | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if cfg.shared_expert_intermediate_size:
            shared = cfg.shared_expert_intermediate_size // tp.world_size
            self.shared_expert = Expert(cfg.hidden_size, shared)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top-k experts ([tokens, k], int64) and their weights (x's dtype)."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(x)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            out = self.every_expert(x, chosen, weights)
        else:
            out = self.grouped(x, chosen, weights)
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            # The gate is per token, so it scales this rank's partial sum before the all-reduce.
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.tp.all_reduce(out)

    def grouped(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum: tokens sorted by expert, one GEMM per expert in use."""
        pairs = chosen.flatten()
        order = pairs.argsort(stable=True)  # stable: each expert's rows keep token order
        token = order // self.top_k
        counts = torch.bincount(pairs, minlength=self.num_experts).tolist()
        rows = x.index_select(0, token).split(counts)
        outs = [expert(r) for expert, r in zip(self.experts, rows, strict=True) if r.shape[0]]
        weighted = torch.cat(outs) * weights.flatten()[order].unsqueeze(1)
        # Each token's experts are added in expert order, as transformers adds them.
        return torch.zeros_like(x).index_add_(0, token, weighted)

    def every_expert(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The same sum with every expert over every token, unchosen ones weighted 0: no host
        sync and shapes fixed by the batch alone, so a CUDA graph can capture a decode step."""
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        dense.scatter_(1, chosen, weights)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + expert(x) * dense[:, e : e + 1]
        return out
