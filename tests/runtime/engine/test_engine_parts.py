"""Engine parts on their own: block manager, detokenizer, sampler masks, tiny checkpoints, RoPE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from frontier_runtime.engine.block_manager import BlockManager
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.detokenizer import IncrementalDetokenizer
from frontier_runtime.engine.sampler import _mask_top_k_top_p
from frontier_runtime.engine.sequence import Sequence
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.layers import rope_inv_freq
from frontier_runtime.requests import SamplingParams
from frontier_runtime.tiny import make_tiny_checkpoint
from frontier_runtime.tokenizer import Tokenizer


def _block_manager(num_blocks: int, block_size: int, prefix_caching: bool = True) -> BlockManager:
    config = EngineConfig(Path("unused"), block_size=block_size, prefix_caching=prefix_caching)
    return BlockManager(config, num_blocks)


def _seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), 0, IncrementalDetokenizer(None), frozenset())


def _computed(bm: BlockManager, seq: Sequence) -> None:
    """Admit and pretend the whole sequence was computed."""
    cached = bm.find_cached_prefix(seq)
    bm.admit(seq, cached, seq.num_tokens - len(cached) * bm.block_size)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_computed_blocks(seq)


# -- block manager ---------------------------------------------------------------------------


def test_a_prefix_hit_never_covers_the_whole_prompt() -> None:
    bm = _block_manager(8, 4)
    first = _seq(list(range(8)))  # exactly two full blocks
    _computed(bm, first)
    again = _seq(list(range(8)), "again")
    assert len(bm.find_cached_prefix(again)) == 1  # capped at num_tokens - 1: one token left to compute


def test_identical_prefixes_share_blocks_by_reference() -> None:
    bm = _block_manager(8, 4)
    a = _seq(list(range(10)), "a")
    _computed(bm, a)
    b = _seq(list(range(8)) + [50, 51, 52], "b")
    _computed(bm, b)
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.ref_counts[x] for x in a.block_table[:2]] == [2, 2]
    assert b.num_cached_prompt_tokens == 8
    bm.release(a)
    bm.release(b)
    assert bm.num_free_blocks == 8 and not any(bm.ref_counts)


def test_freed_blocks_stay_reusable_until_evicted() -> None:
    bm = _block_manager(4, 4)
    a = _seq(list(range(9)), "a")
    _computed(bm, a)
    bm.release(a)
    assert len(bm.find_cached_prefix(_seq(list(range(9)), "b"))) == 2
    filler = _seq(list(range(100, 116)), "filler")  # takes all four blocks: evicts the cached ones
    _computed(bm, filler)
    assert bm.find_cached_prefix(_seq(list(range(9)), "c")) == []


def test_a_different_earlier_block_breaks_the_chain() -> None:
    bm = _block_manager(8, 4)
    _computed(bm, _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"))
    assert bm.find_cached_prefix(_seq([9, 2, 3, 4, 5, 6, 7, 8, 9], "b")) == []


def test_prefix_caching_off_finds_nothing() -> None:
    bm = _block_manager(8, 4, prefix_caching=False)
    _computed(bm, _seq(list(range(9)), "a"))
    assert bm.find_cached_prefix(_seq(list(range(9)), "b")) == []


def test_admission_accounts_for_cached_blocks_leaving_the_free_list() -> None:
    bm = _block_manager(3, 4)
    a = _seq(list(range(9)), "a")
    _computed(bm, a)
    bm.release(a)  # 3 free blocks, 2 of them holding a's prefix
    b = _seq(list(range(8)) + [70, 71, 72, 73, 74], "b")  # hits 2 blocks, needs 2 more: 4 > 3
    cached = bm.find_cached_prefix(b)
    assert len(cached) == 2
    assert not bm.can_admit(b, cached, b.num_tokens - 8)


# -- detokenizer -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(gqa_dir: Path) -> Tokenizer:
    return Tokenizer(gqa_dir)


def test_text_deltas_never_split_a_multi_byte_character(tokenizer: Tokenizer) -> None:
    text = "naïve 東京 🚀🙂 ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = []
    for t in ids:
        detok.append(t)
        deltas.append(detok.take_delta(False))
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    # byte-level pieces of the emoji really do arrive as separate tokens with empty deltas
    assert len(ids) > len([d for d in deltas if d])


def test_stop_strings_are_held_back_until_they_cannot_match(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("alpha beta gamma", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop=("gamma",))
    streamed, hit = "", None
    for t in ids:
        hit = detok.append(t)
        streamed += detok.take_delta(hit is not None)
        if hit:
            break
    assert hit == "gamma"
    assert streamed == "alpha beta "


def test_the_earliest_of_several_stop_strings_wins(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, stop=("mma", "beta"))
    for t in tokenizer.encode("alpha beta gamma", add_special_tokens=False):
        if detok.append(t):
            break
    assert detok.take_delta(True) == "alpha "


def test_special_tokens_are_left_out_of_the_text(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer)
    for t in tokenizer.encode("<|im_end|>hi", add_special_tokens=False):
        detok.append(t)
    assert detok.take_delta(True) == "hi"


# -- tokenizer, chat template ----------------------------------------------------------------


def test_the_chat_template_writes_bos_and_the_assistant_prompt(tokenizer: Tokenizer) -> None:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert set(tokenizer.eos_token_ids) == {
        tokenizer.token_to_id("</s>"),
        tokenizer.token_to_id("<|im_end|>"),
    }


def test_the_chat_template_refuses_an_unknown_role(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="role must be system, user or assistant"):
        tokenizer.apply_chat_template([{"role": "robot", "content": "hi"}])


def test_transformers_reads_the_same_tokenizer(gqa_dir: Path, tokenizer: Tokenizer) -> None:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(gqa_dir / "tokenizer.json"))
    text = "Deploy café 東京 🚀 42"
    assert hf(text)["input_ids"] == tokenizer.encode(text)
    assert hf.vocab_size == 4096


# -- tiny checkpoints ------------------------------------------------------------------------


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    shape = {"hidden_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128}
    a = make_tiny_checkpoint(tmp_path / "a", seed=5, **shape)
    b = make_tiny_checkpoint(tmp_path / "b", seed=5, **shape)
    c = make_tiny_checkpoint(tmp_path / "c", seed=6, **shape)
    names = sorted(p.name for p in a.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_sharded_checkpoints_carry_an_index(tied_dir: Path) -> None:
    index = json.loads((tied_dir / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert "lm_head.weight" not in index["weight_map"]  # tied


def test_unknown_shape_fields_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown shape fields"):
        make_tiny_checkpoint(tmp_path, hidden=64)


def test_the_cli_writes_a_checkpoint(tmp_path: Path, gqa_dir: Path) -> None:
    from frontier_runtime.tiny import main

    main(["--out", str(tmp_path / "cli")])
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (
        gqa_dir / "model.safetensors"
    ).read_bytes()


# -- model pieces ----------------------------------------------------------------------------


def test_llama3_rope_scaling_matches_transformers() -> None:
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    hf_cfg = HFLlamaConfig(
        hidden_size=512, num_attention_heads=4, max_position_embeddings=131072, rope_parameters=rope
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = LlamaConfig.from_hf(hf_cfg.to_dict())
    assert ours.rope_scaling["rope_type"] == "llama3"
    torch.testing.assert_close(rope_inv_freq(ours), expected)


def test_legacy_rope_theta_and_rope_scaling_keys_are_read() -> None:
    cfg = LlamaConfig.from_hf(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "rope_theta": 1234.0,
            "rope_scaling": {"type": "linear", "factor": 2.0},
        }
    )
    assert cfg.rope_theta == 1234.0 and cfg.num_kv_heads == 2
    assert cfg.rope_scaling == {"type": "linear", "factor": 2.0, "rope_type": "linear"}


def test_unsupported_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a Llama-family model"):
        LlamaConfig.from_hf({"model_type": "gpt2"})


def test_top_k_and_top_p_masks_keep_the_right_tokens() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.0], [1.0, 1.0, 1.0, 10.0]])
    masked = _mask_top_k_top_p(logits, torch.tensor([2, 4, 4]), torch.tensor([1.0, 0.7, 0.5]))
    kept = (masked > float("-inf")).tolist()
    assert kept[0] == [True, True, False, False]  # top-2
    assert kept[1] == [True, True, False, False]  # 0.64 + 0.24 reaches 0.7 at the second token
    assert kept[2] == [False, False, False, True]  # one token already holds > 0.5


def test_table_updates_rebuild_every_block_table_and_rows_are_reused() -> None:
    bm = _block_manager(16, 4)
    table: dict[tuple[int, int], int] = {}

    def apply() -> None:
        flat = bm.take_table_updates()
        for i in range(0, len(flat), 3):
            table[(flat[i], flat[i + 1])] = flat[i + 2]

    a, b = _seq(list(range(10)), "a"), _seq(list(range(100, 103)), "b")
    _computed(bm, a)
    _computed(bm, b)
    apply()
    bm.append_slots(a, 3)  # a grows into a fourth block
    apply()
    assert bm.take_table_updates() == []  # nothing changed since
    for seq in (a, b):
        row = bm.row(seq)
        assert [table[(row, c)] for c in range(len(seq.block_table))] == seq.block_table
    row_b = bm.row(b)
    bm.release(b)
    c = _seq(list(range(10)), "c")  # shares a's two full blocks
    _computed(bm, c)
    apply()
    assert bm.row(c) == row_b and [table[(row_b, i)] for i in range(3)] == c.block_table


def test_bf16_weights_give_logits_close_to_fp32(gqa_dir: Path) -> None:
    from frontier_runtime.engine.llm_engine import LLMEngine

    prompt = Tokenizer(gqa_dir).encode("Compare the two precisions on one prompt")
    logits = {}
    for dtype in ("float32", "bfloat16"):
        engine = LLMEngine(gqa_dir, dtype=dtype, num_blocks=16, max_seq_len=64)
        bm = engine.block_manager
        step, _ = engine.runner.prepare(
            [(_admitted(engine, prompt), len(prompt))], bm.row_of, bm.take_table_updates()
        )
        logits[dtype] = engine.runner.execute(step)
    assert logits["bfloat16"].dtype == torch.float32  # logits are always returned in fp32
    similarity = torch.nn.functional.cosine_similarity(logits["bfloat16"], logits["float32"], dim=-1)
    print(f"bf16 vs fp32 logits cosine similarity = {float(similarity):.5f}")
    assert float(similarity) > 0.995
    assert logits["bfloat16"].argmax() == logits["float32"].argmax()


def _admitted(engine, prompt: list[int]) -> Sequence:  # noqa: ANN001
    seq = _seq(prompt)
    engine.block_manager.admit(seq, [], len(prompt))
    return seq
