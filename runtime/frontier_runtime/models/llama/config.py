"""The model's shape and options, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        arch = cfg.get("model_type", "llama")
        if arch not in ("llama", "qwen2", "mistral"):
            raise ValueError(
                f"config.json: model_type {arch!r} is not a Llama-family model (llama, qwen2, mistral)"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {cfg['hidden_act']!r} is not supported (silu)")
        heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = rope or cfg.get("rope_scaling") or None
        if scaling is not None:
            scaling = dict(scaling)
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ("default", "linear", "llama3"):
                raise ValueError(
                    f"config.json: rope type {kind!r} is not supported (default, linear, llama3)"
                )
            scaling["rope_type"] = kind
            if kind == "default":
                scaling = None
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> LlamaConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json in the model directory")
        return cls.from_hf(json.loads(path.read_text()))


def check_tensor_parallel(cfg: LlamaConfig, tp_size: int) -> None:
    """Refuse a tensor-parallel size that does not split the heads and the MLP evenly."""
    for name, value in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if value % tp_size:
            raise ValueError(
                f"parallel.tensor_parallel_size {tp_size} must divide num_attention_heads ({cfg.num_heads}), "
                f"num_key_value_heads ({cfg.num_kv_heads}) and intermediate_size ({cfg.intermediate_size}); "
                f"{name} is {value}"
            )
