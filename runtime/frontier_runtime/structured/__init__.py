"""Structured output: grammars from a request's constraint (``grammar``), per-request matchers and
token bitmasks filled while the model runs (``decoding``), the bitmask applied to logits
(``bitmask``) and the check of finished outputs (``validate``).

The grammar library is llguidance (see ``grammar`` for why)."""
