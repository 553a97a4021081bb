"""The engine's cheaper host paths give what the paths they replaced gave: the stream decoder's text
equals decoding growing windows twice per token, outputs are filled in place, and the scheduler's
record of prefilling sequences pauses batch work exactly while an interactive prompt computes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from frontier_hostside.names import BATCH
from frontier_runtime.engine.detokenizer import IncrementalDetokenizer
from frontier_runtime.engine.output_processor import OutputProcessor
from frontier_runtime.requests import RequestOutput
from frontier_runtime.tokenizer import Tokenizer


class _WindowsOnly:
    """The real tokenizer without ``decode_stream``: the detokenizer's window rule alone."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(token_ids, skip_special_tokens)


@pytest.fixture(scope="module")
def tokenizer(gqa_dir: Path) -> Tokenizer:
    return Tokenizer(gqa_dir)


def _deltas(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], str | None]:
    out = []
    for t in ids:
        hit = detok.append(t)
        out.append(detok.take_delta(hit is not None))
        if hit is not None:
            return out, hit
    detok.flush()
    out.append(detok.take_delta(True))
    return out, None


def test_stream_decoder_gives_the_deltas_of_decoding_windows_twice(tokenizer: Tokenizer) -> None:
    rng = random.Random(7)
    vocab = tokenizer.vocab_size
    text = "naïve café — 日本語 déjà vu 🙂 " * 3
    cases = [tokenizer.encode(text, add_special_tokens=False)]
    cases += [[rng.randrange(vocab) for _ in range(120)] for _ in range(40)]  # specials, broken bytes
    for ids in cases:
        fast = IncrementalDetokenizer(tokenizer)
        assert fast._stream is not None  # the real tokenizer offers the stream decoder
        assert _deltas(fast, ids) == _deltas(IncrementalDetokenizer(_WindowsOnly(tokenizer)), ids)


def test_stream_decoder_finds_stop_strings_where_the_windows_do(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("alpha beta gamma delta epsilon", add_special_tokens=False)
    for stop in [("gamma",), ("mma d", "eps"), ("ta g",), ("never",)]:
        fast = _deltas(IncrementalDetokenizer(tokenizer, stop), ids)
        slow = _deltas(IncrementalDetokenizer(_WindowsOnly(tokenizer), stop), ids)
        assert fast == slow


def test_output_processor_fills_the_engines_output_in_place(tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(tokenizer)
    processor.add("r", ("beta",))
    ids = tokenizer.encode("alpha beta", add_special_tokens=False)
    outputs = [RequestOutput("r", [t], "", False, None, 3, i + 1) for i, t in enumerate(ids)]
    processed = [processor.process(out) for out in outputs]
    assert all(p.output is out for p, out in zip(processed, outputs, strict=True))
    assert "".join(out.new_text for out in outputs) == "alpha "
    last = processed[-1]
    assert last.stopped_by_text and last.output.finish_reason == "stop" and last.output.stop_reason == "beta"


@pytest.mark.slow
def test_batch_work_pauses_exactly_while_an_interactive_prompt_prefills(tied_dir: Path) -> None:
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.requests import SamplingParams

    engine = LLMEngine(tied_dir, max_batch_size=8, max_num_batched_tokens=64, cpu_kv_cache_bytes=16 << 20)
    try:
        batch = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, priority=BATCH)
        engine.add_request("b", list(range(10, 20)), batch)
        for _ in range(3):
            engine.step()
        engine.add_request("i", list(range(20, 20 + 150)), SamplingParams(max_tokens=4, temperature=0.0))
        batch_seq = engine._seqs["b"]
        paused = []
        while "i" in engine._seqs and engine._seqs["i"].num_output_tokens == 0:
            before = batch_seq.num_computed_tokens
            engine.step()
            paused.append(batch_seq.num_computed_tokens == before)
        assert paused == [True, True, True]  # 150 prompt tokens in chunks of 64: three steps
        before = batch_seq.num_computed_tokens
        engine.step()  # the interactive prompt is computed: batch work runs beside its decode
        assert batch_seq.num_computed_tokens == before + 1
    finally:
        engine.shutdown()
