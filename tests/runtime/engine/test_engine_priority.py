"""Priority classes in the scheduler: interactive first, batch on what is left, batch preempted first."""

from __future__ import annotations

from engine_fixtures import Reference
from frontier_hostside.names import BATCH
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams

INTERACTIVE_PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
BATCH_PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, priority=BATCH)


def _run(engine: LLMEngine) -> tuple[list[str], dict[str, list[int]]]:
    """Run to the end: request ids in the order they finished, and each one's tokens."""
    finished, tokens = [], {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finished.append(out.request_id)
    return finished, tokens


def test_an_interactive_request_preempts_the_newest_batch_one_for_a_slot(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=2, max_num_batched_tokens=256, block_size=4)
    engine.add_request("batch-old", tied_ref.prompts[0], BATCH_PARAMS)
    engine.add_request("batch-new", tied_ref.prompts[1], BATCH_PARAMS)
    engine.step()
    engine.step()
    assert len(engine.scheduler.running) == 2
    engine.add_request("chat", tied_ref.prompts[2], INTERACTIVE_PARAMS)
    outs = {o.request_id for o in engine.step()}
    # The interactive request starts at once, alone: the newest batch one gave up its slot and the
    # other sits out the prefill step.
    assert outs == {"chat"}
    assert engine._seqs["batch-new"].status.value == "waiting"
    assert engine.scheduler.num_preemptions == 1
    assert {o.request_id for o in engine.step()} == {"chat", "batch-old"}  # decoding side by side
    finished, _ = _run(engine)
    assert finished.index("chat") < finished.index("batch-new")


def test_interactive_work_queues_ahead_of_batch_work_and_batch_results_stay_exact(
    tied_ref: Reference,
) -> None:
    alone = LLMEngine(tied_ref.model_dir, max_batch_size=1, block_size=4)
    alone.add_request("b1", tied_ref.prompts[0], BATCH_PARAMS)
    alone.add_request("b2", tied_ref.prompts[1], BATCH_PARAMS)
    _, reference = _run(alone)

    engine = LLMEngine(tied_ref.model_dir, max_batch_size=1, block_size=4)
    engine.add_request("b1", tied_ref.prompts[0], BATCH_PARAMS)
    engine.add_request("b2", tied_ref.prompts[1], BATCH_PARAMS)
    first = {o.request_id: list(o.new_token_ids) for o in engine.step()}
    engine.add_request("i1", tied_ref.prompts[2], INTERACTIVE_PARAMS)
    engine.add_request("i2", tied_ref.prompts[3], INTERACTIVE_PARAMS)
    finished, tokens = _run(engine)
    # Both interactive requests ran before any batch work finished; b1 (preempted) resumes before b2.
    assert finished == ["i1", "i2", "b1", "b2"]
    # A preempted batch sequence is recomputed: its greedy output is exactly what it is alone.
    assert first.get("b1", []) + tokens["b1"] == reference["b1"] and tokens["b2"] == reference["b2"]


def test_under_block_pressure_batch_sequences_are_preempted_before_interactive_ones(
    tied_ref: Reference,
) -> None:
    # 24 blocks of 4 tokens: two sequences of 20 + 60 tokens (20 blocks each) cannot both finish.
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=4, block_size=4, num_blocks=24, max_seq_len=96)
    # The batch sequence is the older one: without classes the newest (chat) would be preempted.
    engine.add_request(
        "batch",
        list(range(40, 60)),
        SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, priority=BATCH),
    )
    engine.add_request(
        "chat", list(range(10, 30)), SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    )
    preempted: list[str] = []
    while engine.has_unfinished():
        before = {rid for rid, seq in engine._seqs.items() if seq.status.value == "running"}
        engine.step()
        after = {rid for rid, seq in engine._seqs.items() if seq.status.value == "waiting"}
        preempted += sorted(before & after)
    assert preempted and set(preempted) == {"batch"}


def test_batch_prompts_take_a_small_share_of_a_step(tied_ref: Reference) -> None:
    # 256 tokens a step, 1/8 of them for batch work: a 100-token batch prompt prefills 32 at a time.
    engine = LLMEngine(tied_ref.model_dir, max_batch_size=4, max_num_batched_tokens=256, block_size=4)
    engine.add_request("batch", list(range(10, 110)), BATCH_PARAMS)
    engine.step()
    assert engine._seqs["batch"].num_computed_tokens == 32
    engine.add_request("chat", list(range(200, 300)), INTERACTIVE_PARAMS)
    engine.step()
    # The interactive prompt prefills whole, alone (batch sits out interactive prefill steps).
    assert engine._seqs["chat"].num_computed_tokens == 100
    assert engine._seqs["batch"].num_computed_tokens == 32
