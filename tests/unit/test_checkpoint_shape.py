"""``fab weights.push`` holds the stack's ``model:`` shape to the checkpoint's ``config.json`` before
anything is uploaded: a field that differs is one line naming it, both values and the file."""

from __future__ import annotations

import json
from pathlib import Path

from fab_program import fab

from frontier.release.shape import shape_problems
from frontier.targets import load_stack

# The local stack's tiny model as frontier_runtime.tiny writes its config.json.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}


def checkpoint(tmp_path: Path, **changes: object) -> Path:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**TINY, **changes}, indent=2))
    return src


def test_a_checkpoint_of_another_hidden_size_is_refused_before_any_upload(capsys, tmp_path):
    src = checkpoint(tmp_path, hidden_size=512)
    code, out, err = fab(capsys, "weights.push", "-s", "local", "--src", str(src))
    assert code != 0
    lines = [line for line in (out + err).splitlines() if "config.json" in line]
    assert lines == [
        f"error: {src}/config.json: model.hidden_size = 256, but the checkpoint's config.json has "
        "hidden_size = 512: the stack's model: shape must be the checkpoint's (the memory fit and the "
        "plan are computed from it)"
    ]


def test_the_local_stacks_shape_is_its_tiny_checkpoints():
    assert shape_problems(load_stack("local").model, TINY, "config.json") == []


def test_a_config_without_kv_heads_has_one_per_attention_head():
    model = load_stack("local").model  # 8 heads, 4 KV heads
    config = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    (problem,) = shape_problems(model, config, "config.json")
    assert "model.num_kv_heads = 4, but the checkpoint's config.json has num_key_value_heads = 8" in problem


def test_a_multimodal_checkpoints_text_config_is_the_shape_compared():
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "text_config": {**TINY, "num_hidden_layers": 6},
    }
    (problem,) = shape_problems(load_stack("local").model, config, "config.json")
    assert "model.num_layers = 4, but the checkpoint's config.json has num_hidden_layers = 6" in problem
