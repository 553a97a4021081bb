"""Build a ``LlamaForCausalLM`` and fill it from a safetensors checkpoint, sharded for its rank.

Reads ``model.safetensors``, or the shards listed in ``model.safetensors.index.json``, or every
``*.safetensors`` file of the directory. q/k/v and gate/up are concatenated into the fused
projections as they are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from frontier_runtime.distributed import SINGLE, TPGroup
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import Linear, rope_tables
from frontier_runtime.models.llama.model import LlamaForCausalLM


def _checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors, index or *.safetensors files")
    return found


def _read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in _checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = f.get_tensor(name)
    return tensors


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tp: TPGroup = SINGLE,
) -> LlamaForCausalLM:
    """Build the model on ``device`` and fill it from the checkpoint, sharded for ``tp``."""
    model_dir = Path(model_dir)
    device = torch.device(device)
    cfg = LlamaConfig.from_dir(model_dir)
    if device.type == "cpu":
        # On CPU the random init is cheap, while the meta device routes init through torch's Python
        # meta kernels, importing ~800 more modules: +6 s at start and +3 s at exit on 2 cores.
        model = LlamaForCausalLM(cfg, tp).to(dtype)
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg, tp)
        model = model.to_empty(device=device).to(dtype)
    ckpt = _read_checkpoint(model_dir)

    def take(name: str) -> torch.Tensor:
        if name not in ckpt:
            raise KeyError(f"{model_dir}: checkpoint lacks tensor {name!r}")
        return ckpt.pop(name)

    def put(param: torch.Tensor, value: torch.Tensor, what: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise ValueError(
                f"{model_dir}: {what} has shape {tuple(value.shape)}, expected {tuple(param.shape)}"
            )
        param.data.copy_(value.to(dtype))

    def col(name: str) -> torch.Tensor:
        return tp.shard(take(name), 0)

    with torch.no_grad():
        put(model.embed_tokens.weight, take("model.embed_tokens.weight"), "model.embed_tokens.weight")
        put(model.norm.weight, take("model.norm.weight"), "model.norm.weight")
        if model.lm_head is not None:
            put(model.lm_head.weight, take("lm_head.weight"), "lm_head.weight")
        ckpt.pop("lm_head.weight", None)  # tied checkpoints sometimes carry a copy anyway
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            put(layer.input_layernorm.weight, take(p + "input_layernorm.weight"), p + "input_layernorm")
            put(
                layer.post_attention_layernorm.weight,
                take(p + "post_attention_layernorm.weight"),
                p + "post_attention_layernorm",
            )
            a = p + "self_attn."
            qkv = torch.cat([col(a + "q_proj.weight"), col(a + "k_proj.weight"), col(a + "v_proj.weight")])
            put(layer.self_attn.qkv_proj.weight, qkv, a + "qkv_proj")
            if cfg.attention_bias:
                bias = torch.cat([col(a + "q_proj.bias"), col(a + "k_proj.bias"), col(a + "v_proj.bias")])
                put(layer.self_attn.qkv_proj.bias, bias, a + "qkv_proj.bias")
            put(layer.self_attn.o_proj.weight, tp.shard(take(a + "o_proj.weight"), 1), a + "o_proj")
            m = p + "mlp."
            gate_up = torch.cat([col(m + "gate_proj.weight"), col(m + "up_proj.weight")])
            put(layer.mlp.gate_up_proj.weight, gate_up, m + "gate_up_proj")
            put(layer.mlp.down_proj.weight, tp.shard(take(m + "down_proj.weight"), 1), m + "down_proj")
            if cfg.mlp_bias:
                put(
                    layer.mlp.gate_up_proj.bias,
                    torch.cat([col(m + "gate_proj.bias"), col(m + "up_proj.bias")]),
                    m + "gate_up_proj.bias",
                )
                down_bias = take(m + "down_proj.bias")
                if layer.mlp.down_proj.bias is not None:  # added once, on rank 0, before the all-reduce
                    put(layer.mlp.down_proj.bias, down_bias, m + "down_proj.bias")
    leftover = [k for k in ckpt if not k.endswith("rotary_emb.inv_freq")]
    if leftover:
        raise ValueError(f"{model_dir}: unexpected tensors in checkpoint: {leftover[:5]}")
    model.rope_cos, model.rope_sin = rope_tables(cfg, device)
    if device.type == "cpu":
        for module in model.modules():
            if isinstance(module, Linear):
                module.use_transposed_weight()
    return model.eval().requires_grad_(False)
