"""The model's shape and options, read from a Hugging Face ``config.json``.

One dataclass covers every family the runtime serves; a family differs only in the fields it
sets: Qwen3's per-head q/k norms (``qk_norm``), and the sparse MLP of Mixtral, Qwen2-MoE and
Qwen3-MoE (``num_experts`` > 0: routed experts on the layers in ``sparse_layers``, Qwen2-MoE's
gated shared expert when ``shared_expert_intermediate_size`` > 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# model_type -> whether q/k/v carry a bias when config.json does not say.
ARCHITECTURES = {
    "llama": False,
    "mistral": False,
    "qwen2": True,
    "qwen3": False,
    "mixtral": False,
    "qwen2_moe": True,
    "qwen3_moe": False,
}
QK_NORM = ("qwen3", "qwen3_moe")
# transformers' num_experts_per_tok where config.json leaves it out.
TOP_K_DEFAULT = {"mixtral": 2, "qwen2_moe": 4, "qwen3_moe": 8}


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
    model_type: str = "llama"
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3)
    num_experts: int = 0  # 0: every MLP is dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0  # each expert's
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    norm_topk_prob: bool = True  # renormalise the top-k routing weights to sum to 1
    sparse_layers: tuple[int, ...] = ()  # the layers whose MLP is the sparse one
    sliding_window: int | None = None  # keys a query of a sliding layer sees, its own included
    sliding_layers: tuple[int, ...] = ()  # the layers that attend within sliding_window

    def window_of(self, layer: int) -> int:
        """The sliding window ``layer`` attends within, or 0 where it sees the whole context."""
        if self.sliding_window is None or layer not in self.sliding_layers:
            return 0
        return self.sliding_window

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> LlamaConfig:
        arch = cfg.get("model_type", "llama")
        if arch not in ARCHITECTURES:
            raise ValueError(
                f"config.json: model_type {arch!r} is not a Llama-family model ({', '.join(ARCHITECTURES)})"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {cfg['hidden_act']!r} is not supported (silu)")
        heads = cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
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
        # Mixtral calls its expert count num_local_experts and sizes experts by intermediate_size;
        # the Qwen MoEs call it num_experts and size experts by moe_intermediate_size.
        experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
        if arch == "mixtral":
            expert_size, sparse = cfg["intermediate_size"], tuple(range(layers))
        elif arch in ("qwen2_moe", "qwen3_moe") and experts:
            expert_size = cfg["moe_intermediate_size"]
            step, dense_only = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or ())
            sparse = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        else:
            experts, expert_size, sparse = 0, 0, ()
        top_k = cfg.get("num_experts_per_tok", TOP_K_DEFAULT.get(arch, 0)) if experts else 0
        if experts and not 1 <= top_k <= experts:
            raise ValueError(
                f"config.json: num_experts_per_tok {top_k} must be between 1 and the number of experts ({experts})"
            )
        max_positions = cfg.get("max_position_embeddings", 2048)
        window = _sliding_window(arch, cfg)
        sliding = _sliding_layers(arch, cfg, layers) if window is not None else ()
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=max_positions,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2-MoE names its q/k/v bias qkv_bias; older configs of it and of Qwen2 name none.
            attention_bias=bool(cfg.get("attention_bias", cfg.get("qkv_bias", ARCHITECTURES[arch]))),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
            model_type=arch,
            qk_norm=arch in QK_NORM,
            num_experts=experts,
            num_experts_per_tok=top_k,
            moe_intermediate_size=expert_size,
            shared_expert_intermediate_size=(
                (cfg.get("shared_expert_intermediate_size") or 0) if arch == "qwen2_moe" else 0
            ),
            # Mixtral always renormalises; the Qwen MoEs say so in norm_topk_prob (default off).
            norm_topk_prob=arch == "mixtral" or bool(cfg.get("norm_topk_prob", False)),
            sparse_layers=sparse,
            sliding_window=window if sliding else None,
            sliding_layers=sliding,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> LlamaConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json in the model directory")
        return cls.from_hf(json.loads(path.read_text()))


def _sliding_window(arch: str, cfg: dict[str, Any]) -> int | None:
    """The window the sliding layers attend within, or None where every layer attends to the whole context."""
    window = cfg.get("sliding_window")
    if not window or arch == "llama":  # Llama's attention has no window, whatever its config says
        return None
    # Qwen configs carry a sliding_window that only use_sliding_window switches on.
    if arch.startswith("qwen") and not cfg.get("use_sliding_window", False):
        return None
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"config.json: sliding_window {window!r} must be a whole number of tokens >= 1")
    return window


def _sliding_layers(arch: str, cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """The layers that attend within the window, as transformers' modelling code of ``arch`` picks them."""
    if arch in ("mistral", "mixtral", "qwen3_moe"):  # every layer (Mistral ignores layer_types)
        return tuple(range(layers))
    if cfg.get("layer_types"):
        return tuple(i for i, kind in enumerate(cfg["layer_types"]) if kind == "sliding_attention")
    # Older Qwen configs name no layer_types: max_window_layers splits them, each family its own way.
    bound = cfg.get("max_window_layers", 28)
    if arch == "qwen2_moe":
        return tuple(i for i in range(layers) if (i + 1) % 2 and i < bound)
    return tuple(i for i in range(layers) if i >= bound)


def check_tensor_parallel(cfg: LlamaConfig, tp_size: int) -> None:
    """Refuse a tensor-parallel size that does not split the heads and the MLPs evenly."""
    sizes = [
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ]
    if cfg.num_experts:  # each expert's MLP is split like the dense one
        sizes.append(("the experts' intermediate size", cfg.moe_intermediate_size))
    if cfg.shared_expert_intermediate_size:
        sizes.append(("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size))
    for name, value in sizes:
        if value % tp_size:
            named = [f"{n} ({v})" for n, v in sizes]
            listed = ", ".join(named[:-1]) + " and " + named[-1]
            raise ValueError(
                f"parallel.tensor_parallel_size {tp_size} must divide {listed}; {name} is {value}"
            )
