"""Token bitmasks: which tokens each constrained row of a batch may sample next.

One int32 word holds 32 tokens (bit ``i`` of word ``w`` is token ``32 w + i``), the layout
llguidance fills. Applying it adds 0 or -inf to each logit through a 256 x 8 lookup table indexed
by the mask's bytes: one gather and one ``index_add_`` over the constrained rows only, the same
on CPU and CUDA; the unconstrained rows of the batch are not touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BITS = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
_BIAS = torch.where(_BITS.bool(), 0.0, float("-inf"))  # [byte value, bit] -> additive bias
_BIAS_ON: dict[torch.device, torch.Tensor] = {}


def words_for(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


@dataclass
class TokenBitmask:
    """``bits[i]`` is the mask of logits row ``rows[i]``; rows not listed are unconstrained."""

    rows: list[int]
    bits: torch.Tensor  # int32 [len(rows), words], on the host

    def apply(self, logits: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place (``logits`` is float32 [batch, vocab])."""
        if not self.rows:
            return
        dev = logits.device
        table = _BIAS_ON.get(dev)
        if table is None:
            table = _BIAS_ON.setdefault(dev, _BIAS.to(dev))
        vocab = logits.shape[1]
        count = len(self.rows)
        bytes_ = self.bits.view(torch.uint8).to(dev, non_blocking=True).long()
        bias = table[bytes_].view(count, -1)
        if bias.shape[1] < vocab:  # logits wider than the tokenizer's vocabulary: padding rows
            pad = bias.new_full((count, vocab - bias.shape[1]), float("-inf"))
            bias = torch.cat([bias, pad], dim=1)
        rows = torch.tensor(self.rows, dtype=torch.long).to(dev, non_blocking=True)
        logits.index_add_(0, rows, bias[:, :vocab])
