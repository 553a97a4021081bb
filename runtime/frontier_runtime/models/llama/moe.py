"""The sparse MLP of Mixtral, Qwen2-MoE and Qwen3-MoE: a router picks each token's top-k experts.

Routing follows transformers: softmax over the router's logits in float32, the top-k
probabilities (renormalised to sum to 1 where ``norm_topk_prob`` says so, as Mixtral always does)
weight the chosen experts' SwiGLU outputs. Qwen2-MoE adds a shared expert that every token
passes through, scaled by ``sigmoid(shared_expert_gate(x))``.

A step's tokens are grouped by expert (one argsort of the token-expert pairs), so each expert
runs one GEMM over all of its tokens, and the weighted rows are summed back into their tokens with
one ``index_add_``.

Parallelism (the layout is :mod:`frontier_runtime.distributed`'s): the sparse layer runs over all
G = max(TP, EP) ranks of a pipeline stage. Each rank holds E / EP whole experts (the ones of its
expert shard), split along their intermediate dimension over the G / EP ranks that share the shard
(gate/up column-parallel, down row-parallel); EP = 1 is tensor parallelism alone, every rank
holding every expert's slice. The router is whole on every rank, so all ranks route alike. The
shared expert (Qwen2-MoE) is split by columns over all G ranks.

Dispatch and combine: every rank of a stage already holds every token of the step (one scheduler
feeds every rank; tensor-parallel attention ends in an all-reduce), so dispatch moves nothing: each
rank picks out the rows routed to its own experts. Combine is one all-reduce over the stage of the
[tokens, hidden] partial sums (routed and shared together), in place of the dense MLP's all-reduce:
a ring moves 2 (G - 1) / G x tokens x hidden x dtype bytes per rank per sparse layer
(``combine_bytes``). An all-to-all (gloo has ``all_to_all_single`` on CPU in torch 2.13) would send
only the k / G routed copies of a rank's own tokens, but it pays only when each rank holds its own
tokens, i.e. with data-parallel attention groups, which this engine does not have: here it would
first need the all-gather the replicated tokens make unnecessary.
"""

from __future__ import annotations

import torch
from torch import nn

from frontier_runtime.distributed import Placement
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
    def __init__(self, cfg: LlamaConfig, placement: Placement) -> None:
        super().__init__()
        self.stage = placement.stage  # the combine's all-reduce
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.renormalize = cfg.norm_topk_prob
        # nn.Linear, not the packed Linear: the router's few outputs are computed as transformers
        # does, so near-equal logits pick the same experts.
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        shards = placement.experts
        held = cfg.num_experts // shards.world_size
        self.first_expert = shards.rank * held  # this rank's experts: [first_expert, first_expert + held)
        self.expert_parallel = shards.world_size > 1
        inter = cfg.moe_intermediate_size // placement.expert_columns.world_size
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, inter) for _ in range(held))
        self.shared_expert: Expert | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if cfg.shared_expert_intermediate_size:
            shared = cfg.shared_expert_intermediate_size // placement.stage.world_size
            self.shared_expert = Expert(cfg.hidden_size, shared)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)
        self.combined_bytes = 0  # bytes of partial sums this layer all-reduced (expert parallelism only)

    @property
    def expert_ids(self) -> range:
        """The experts (checkpoint numbering) this rank holds."""
        return range(self.first_expert, self.first_expert + len(self.experts))

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
        if self.expert_parallel:
            self.combined_bytes += out.numel() * out.element_size()
        return self.stage.all_reduce(out)

    def grouped(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum: tokens sorted by expert, one GEMM per expert in use."""
        pairs = chosen.flatten()
        if self.expert_parallel:
            return self._grouped_local(x, pairs, weights.flatten())
        order = pairs.argsort(stable=True)  # stable: each expert's rows keep token order
        token = order // self.top_k
        counts = torch.bincount(pairs, minlength=self.num_experts).tolist()
        rows = x.index_select(0, token).split(counts)
        outs = [expert(r) for expert, r in zip(self.experts, rows, strict=True) if r.shape[0]]
        weighted = torch.cat(outs) * weights.flatten()[order].unsqueeze(1)
        # Each token's experts are added in expert order, as transformers adds them.
        return torch.zeros_like(x).index_add_(0, token, weighted)

    def _grouped_local(self, x: torch.Tensor, pairs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``grouped`` over this rank's experts only: the token-expert pairs routed elsewhere are
        dropped before the sort (their rows are another rank's partial sum)."""
        local = pairs - self.first_expert
        mine = ((local >= 0) & (local < len(self.experts))).nonzero().squeeze(1)
        out = torch.zeros_like(x)
        if mine.numel() == 0:
            return out
        local = local.index_select(0, mine)
        order = local.argsort(stable=True)
        pair = mine.index_select(0, order)
        token = pair // self.top_k
        counts = torch.bincount(local, minlength=len(self.experts)).tolist()
        rows = x.index_select(0, token).split(counts)
        outs = [expert(r) for expert, r in zip(self.experts, rows, strict=True) if r.shape[0]]
        weighted = torch.cat(outs) * weights.index_select(0, pair).unsqueeze(1)
        return out.index_add_(0, token, weighted)

    def every_expert(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The same sum with every expert over every token, unchosen ones weighted 0: no host
        sync and shapes fixed by the batch alone, so a CUDA graph can capture a decode step."""
        dense = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        dense.scatter_(1, chosen, weights)
        out = torch.zeros_like(x)
        for e, expert in zip(self.expert_ids, self.experts, strict=True):
            out = out + expert(x) * dense[:, e : e + 1]
        return out


def combine_bytes(tokens: int, hidden: int, itemsize: int, ranks: int) -> int:
    """Bytes one rank sends in one sparse layer's combine: a ring all-reduce of [tokens, hidden]."""
    return 2 * (ranks - 1) * tokens * hidden * itemsize // ranks
