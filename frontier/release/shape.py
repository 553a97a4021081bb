"""The stack's ``model:`` shape held to the checkpoint's own ``config.json``.

The shape (layers, hidden size, heads, KV heads, vocabulary, MLP width, experts) is what the memory
fit, the roofline and the plan are computed from; the runtime itself reads the checkpoint's config.
A stack that describes another model than the one it uploads plans for a model it never serves, so
``fab weights.push`` refuses it before anything is uploaded, one line per field that differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from frontier.config.schema import Model
from frontier.errors import FrontierError

#: The stack's field → the names Hugging Face configs give it, most common first.
KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "vocab_size": ("vocab_size",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "num_experts": ("num_local_experts", "n_routed_experts", "num_experts"),
    "num_experts_per_token": ("num_experts_per_tok", "moe_topk"),
    "moe_intermediate_size": ("moe_intermediate_size",),
}


class ShapeMismatch(FrontierError):
    """The stack's model shape is not the checkpoint's."""


def shape_problems(model: Model, config: dict[str, Any], where: str) -> list[str]:
    """One line per field of ``model`` that the checkpoint's ``config`` (read from ``where``) gives
    otherwise; a field the config does not name is not compared."""
    # Multimodal checkpoints keep the language model's shape under text_config.
    text = config.get("text_config")
    found = {**config, **text} if isinstance(text, dict) else config
    if not any(key in found for key in KEYS["num_kv_heads"]) and "num_attention_heads" in found:
        found = {**found, "num_key_value_heads": found["num_attention_heads"]}  # no GQA: one per head
    problems = []
    for field, keys in KEYS.items():
        key = next((k for k in keys if k in found and found[k] is not None), None)
        if key is None:
            continue
        ours, theirs = getattr(model, field), found[key]
        if field == "moe_intermediate_size" and ours == 0:
            continue  # 0 means "intermediate_size" in the stack
        if ours != theirs:
            problems.append(
                f"{where}: model.{field} = {ours!r}, but the checkpoint's config.json has {key} = "
                f"{theirs!r}: the stack's model: shape must be the checkpoint's (the memory fit and "
                "the plan are computed from it)"
            )
    return problems


def check_checkpoint(model: Model, src: Path) -> None:
    """Refuse ``src`` (a model directory) whose ``config.json`` gives another shape than ``model``."""
    config_file = src / "config.json"
    if not config_file.is_file():
        raise ShapeMismatch(
            f"{config_file}: no config.json in the model directory; the checkpoint's shape cannot be "
            "checked against the stack's model:"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ShapeMismatch(f"{config_file}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    problems = shape_problems(model, config if isinstance(config, dict) else {}, str(config_file))
    if problems:
        raise ShapeMismatch("\n".join(problems))
