"""Qwen3, Mixtral, Qwen2-MoE and Qwen3-MoE greedy-equal transformers token for token.

Each checkpoint is the one transformers itself writes (``save_pretrained``) for a random model of
that family, two shapes per family; references come from ``AutoModelForCausalLM.generate
(do_sample=False)``, one prompt at a time without padding, in fp32. The engine runs all prompts in
one batch, so a step's tokens reach the experts mixed across sequences, prefills and decodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_fixtures import MAX_NEW, random_fillers
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.models.llama import load_model
from frontier_runtime.models.llama.moe import SparseMoE
from frontier_runtime.requests import SamplingParams
from safetensors.torch import save_file

GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
VOCAB = 512
COMMON = {
    "vocab_size": VOCAB,
    "num_hidden_layers": 2,
    "max_position_embeddings": 256,
    "hidden_act": "silu",
    "bos_token_id": None,
    "eos_token_id": None,  # no early stops: every output runs the full MAX_NEW tokens
    "pad_token_id": None,
}
# model_type -> its two shapes (config.json fields): a small one, then a wider one with other options.
FAMILIES: dict[str, list[dict[str, Any]]] = {
    "qwen3": [
        # head_dim 32 with hidden 64: q/k norms act on 32-wide heads, not hidden // heads.
        {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "tie_word_embeddings": True},
        {"hidden_size": 128, "intermediate_size": 192, "num_attention_heads": 8, "num_key_value_heads": 8,
         "head_dim": 16, "tie_word_embeddings": False},
    ],
    "mixtral": [
        {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_local_experts": 4, "num_experts_per_tok": 2},
        {"hidden_size": 128, "intermediate_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_local_experts": 8, "num_experts_per_tok": 2},
    ],
    "qwen2_moe": [
        # Shared expert beside 4 routed ones, top-2 weights not renormalised (Qwen1.5-MoE's way).
        {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
         "shared_expert_intermediate_size": 96, "norm_topk_prob": False},
        # Layer 0 dense (decoder_sparse_step 2), layer 1 sparse with renormalised weights.
        {"hidden_size": 128, "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4,
         "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
         "shared_expert_intermediate_size": 64, "norm_topk_prob": True, "decoder_sparse_step": 2},
    ],
    "qwen3_moe": [
        {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True},
        # Layer 0 dense (mlp_only_layers), top-2 weights as the softmax gives them.
        {"hidden_size": 128, "intermediate_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4,
         "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
         "norm_topk_prob": False, "mlp_only_layers": [0]},
    ],
}  # fmt: skip
CASES = [(family, i) for family, shapes in FAMILIES.items() for i in range(len(shapes))]


@dataclass(frozen=True)
class Reference:
    model_dir: Path
    prompts: list[list[int]]
    outputs: list[list[int]]


def write_checkpoint(out: Path, model_type: str, seed: int, **fields: Any) -> Path:
    """A random ``model_type`` model as transformers saves it. Matrices are drawn with std 0.1 and
    norms around 1 (not all ones, so a norm loaded in the wrong place shows): random models with
    transformers' usual 0.02 have near-uniform logits and argmax flips on rounding noise."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**COMMON, **fields})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=g))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=g))
    model.save_pretrained(out)
    return out


def transformers_greedy(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False
            )
            outs.append(out[0, len(p) :].tolist())
    return outs


def make_reference(out: Path, model_type: str, seed: int, **fields: Any) -> Reference:
    model_dir = write_checkpoint(out, model_type, seed, **fields)
    prompts = random_fillers(8, seed=seed, vocab=VOCAB)
    return Reference(model_dir, prompts, transformers_greedy(model_dir, prompts))


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Reference]:
    return {
        (family, i): make_reference(
            tmp_path_factory.mktemp(f"{family}-{i}"), family, seed=10 + i, **FAMILIES[family][i]
        )
        for family, i in CASES
    }


@pytest.mark.parametrize(("family", "shape"), CASES, ids=[f"{f}-shape{i}" for f, i in CASES])
def test_greedy_matches_transformers_token_for_token(
    family: str, shape: int, references: dict[tuple[str, int], Reference]
) -> None:
    ref = references[family, shape]
    assert len({len(p) for p in ref.prompts}) >= 6
    engine = LLMEngine(ref.model_dir, max_batch_size=8)
    assert engine.generate(ref.prompts, GREEDY) == ref.outputs


def test_moe_equals_transformers_when_long_prompts_prefill_in_small_chunks(
    references: dict[tuple[str, int], Reference],
) -> None:
    # 16 tokens a step: prefill chunks of one prompt meet decodes of others at the experts.
    ref = references["qwen2_moe", 1]
    engine = LLMEngine(ref.model_dir, max_batch_size=8, max_num_batched_tokens=16)
    assert engine.generate(ref.prompts, GREEDY) == ref.outputs


def test_moe_tp2_over_gloo_equals_transformers(references: dict[tuple[str, int], Reference]) -> None:
    # Routed experts and the gated shared expert are both split over the two ranks.
    ref = references["qwen2_moe", 0]
    engine = LLMEngine(ref.model_dir, tensor_parallel_size=2, max_batch_size=8)
    try:
        moe = engine.runner.model.layers[0].mlp
        assert isinstance(moe, SparseMoE)
        assert moe.experts[0].down_proj.in_features == 16  # half of moe_intermediate_size 32
        outs = engine.generate(ref.prompts, GREEDY)
    finally:
        engine.shutdown()
    assert outs == ref.outputs


def test_the_cuda_graph_path_of_the_experts_computes_the_grouped_sum(
    references: dict[tuple[str, int], Reference],
) -> None:
    model = load_model(references["mixtral", 1].model_dir)
    moe = model.layers[0].mlp
    assert isinstance(moe, SparseMoE)
    x = torch.randn(37, 128, generator=torch.Generator().manual_seed(0))
    chosen, weights = moe.route(x)
    torch.testing.assert_close(moe.every_expert(x, chosen, weights), moe.grouped(x, chosen, weights))


def test_a_router_that_does_not_match_num_experts_is_refused_before_loading(
    tmp_path: Path, references: dict[tuple[str, int], Reference]
) -> None:
    # The checkpoint holds the routers alone: loading would fail first on the missing embedding.
    src = references["mixtral", 0].model_dir  # 4 experts, hidden 64
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_local_experts": 6}))
    routers = {f"model.layers.{i}.block_sparse_moe.gate.weight": torch.zeros(4, 64) for i in range(2)}
    save_file(routers, str(tmp_path / "model.safetensors"))
    refused = r"block_sparse_moe\.gate\.weight has shape \(4, 64\) but config\.json says num_experts 6 x hidden_size 64"
    with pytest.raises(ValueError, match=refused):
        LLMEngine(tmp_path)


def test_an_unknown_architecture_is_refused_naming_the_supported_ones(tmp_path: Path) -> None:
    # Only a config.json: the refusal comes before any weight file is looked for.
    (tmp_path / "config.json").write_text(json.dumps({**COMMON, "model_type": "gemma2", "hidden_size": 64}))
    supported = r"\(llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe\)"
    with pytest.raises(ValueError, match=r"model_type 'gemma2' is not a Llama-family model " + supported):
        LLMEngine(tmp_path)


def test_tp_size_that_does_not_split_the_experts_is_refused(tmp_path: Path) -> None:
    shape = {"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}
    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 30}
    (tmp_path / "config.json").write_text(
        json.dumps({**COMMON, "model_type": "qwen3_moe", **shape, **experts})
    )
    refused = r"tensor_parallel_size 4 must divide .*; the experts' intermediate size is 30"
    with pytest.raises(ValueError, match=refused):
        LLMEngine(tmp_path, tensor_parallel_size=4)


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """Mistral with a 128-token sliding window (max_position_embeddings 256); prompts + outputs fit it
    (test_sliding_window runs past windows)."""
    shape = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2}
    fields = {**shape, "sliding_window": 128}
    return make_reference(tmp_path_factory.mktemp("mistral-window"), "mistral", seed=5, **fields)


def test_mistral_within_its_sliding_window_matches_transformers(windowed: Reference) -> None:
    engine = LLMEngine(windowed.model_dir, max_batch_size=8)
    assert engine.max_seq_len == 256  # the window slides: the context is the model's whole one
    assert max(len(p) for p in windowed.prompts) + MAX_NEW <= 128
    assert engine.generate(windowed.prompts, GREEDY) == windowed.outputs
