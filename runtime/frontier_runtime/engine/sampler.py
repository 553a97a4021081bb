"""Token sampling for a batch, vectorised over rows.

Greedy rows take the argmax of the raw logits. Sampled rows scale by temperature, mask by top-k and
top-p, and draw with the exponential race (argmax of p / E, E ~ Exp(1)), which equals drawing from
p. A seeded request fills its row of E from its own ``torch.Generator``, so its draws depend only on
its seed and its own logits, never on what else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frontier_runtime.requests import SamplingParams, TokenLogprob
from frontier_runtime.structured.bitmask import TokenBitmask


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


class Sampler:
    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        allowed: TokenBitmask | None = None,
    ) -> SampleResult:
        logits = logits.float()
        if allowed is not None:  # structured output: disallowed tokens of constrained rows -> -inf
            allowed.apply(logits)
        rows, vocab = logits.shape
        greedy = [p.temperature == 0.0 for p in params]  # SamplingParams.greedy, without a call per row
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, params, generators, greedy)
        if all(p.logprobs is None for p in params):
            return SampleResult(tokens.tolist(), [None] * rows)
        want = [p.logprobs for p in params]
        return self._with_logprobs(logits, tokens, want)

    def _sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        greedy: list[bool],
    ) -> torch.Tensor:
        rows, vocab = logits.shape
        dev = logits.device
        temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=dev).unsqueeze(1)
        scaled = logits / temps
        top_ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_ps = [p.top_p for p in params]
        if any(k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
            scaled = _mask_top_k_top_p(
                scaled, torch.tensor(top_ks, device=dev), torch.tensor(top_ps, device=dev)
            )
        probs = torch.softmax(scaled, dim=-1)
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.generator)
        for i, g in enumerate(generators):
            if g is not None and not greedy[i]:
                noise[i].exponential_(generator=g)
        sampled = (probs / noise).argmax(dim=-1)
        if any(greedy):
            mask = torch.tensor(greedy, device=dev)
            sampled = torch.where(mask, logits.argmax(dim=-1), sampled)
        return sampled

    @staticmethod
    def _with_logprobs(logits: torch.Tensor, tokens: torch.Tensor, want: list[int | None]) -> SampleResult:
        """Tokens and logprobs through one device-to-host copy for the whole step (never per row)."""
        lp = torch.log_softmax(logits, dim=-1)
        top_n = max(w or 0 for w in want)
        # float64 holds every float32 logprob and every token id exactly.
        parts = [tokens.unsqueeze(1).double(), lp.gather(1, tokens.unsqueeze(1)).double()]
        if top_n:
            top_vals, top_ids = lp.topk(top_n, dim=-1)
            parts += [top_ids.double(), top_vals.double()]
        host = torch.cat(parts, dim=1).cpu().tolist()
        token_list = [int(row[0]) for row in host]
        out: list[TokenLogprob | None] = []
        for row, w in zip(host, want, strict=True):
            if w is None:
                out.append(None)
                continue
            ids, vals = row[2 : 2 + top_n], row[2 + top_n :]
            top = {int(ids[j]): vals[j] for j in range(w)}
            out.append(TokenLogprob(token_id=int(row[0]), logprob=row[1], top=top))
        return SampleResult(token_list, out)


def _mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = ranks >= top_k.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly ahead of each token
    drop = before >= top_p.unsqueeze(1)  # the top token always stays (nothing ahead of it)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
