"""Pipeline parallelism: layers split over stages in real gloo processes give the PP=1 outputs.

Each stage holds a contiguous range of layers (the first the embedding, the last the final norm
and the LM head); hidden states go stage to stage, and a step of several sequences runs as
micro-batches so a stage works on one while the next stage works on the previous one.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from engine_fixtures import Reference, generate_tracking_batch
from frontier_runtime.config import parse_config
from frontier_runtime.distributed import Layout
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.engine.model_runner import StepInput
from frontier_runtime.models.llama import load_model
from frontier_runtime.models.llama.loader import Checkpoint
from frontier_runtime.requests import SamplingParams
from test_expert_parallel import MIXTRAL, generate, make_reference

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def test_pp2_over_gloo_equals_transformers_with_a_tied_head(tied_ref: Reference) -> None:
    # Two layers, one per stage; the LM head is the embedding, so the last stage holds it too.
    engine = LLMEngine(tied_ref.model_dir, pipeline_parallel_size=2, max_batch_size=8)
    try:
        model = engine.runner.model
        assert list(model.layer_ids) == [0] and model.norm is None and model.embed_tokens is not None
        assert len(engine.runner.kv_caches) == 1  # the KV cache of its own layer only
        outs, largest = generate_tracking_batch(engine, tied_ref.prompts, GREEDY)
        # 8 sequences as two steps of 4 (one micro-batch each), both in flight at once.
        assert largest == 4
    finally:
        engine.shutdown()
    assert outs == tied_ref.outputs
    assert all(not p.is_alive() for p in engine.workers.processes)


def test_a_pipeline_keeps_one_step_per_stage_in_flight(tied_ref: Reference) -> None:
    # While the last stage finishes one step, rank 0's stage runs the next: no stage idles while
    # rank 0 samples and schedules. Each step holds its own sequences (none is in two at once).
    engine = LLMEngine(tied_ref.model_dir, pipeline_parallel_size=2, max_batch_size=8)
    runner = engine.runner
    launched, at_collect = [0], []
    launch, collect = runner.launch, runner.collect

    def counting_launch(step):  # noqa: ANN001, ANN202
        launched[0] += 1
        return launch(step)

    def counting_collect(flight):  # noqa: ANN001, ANN202
        at_collect.append(launched[0])  # steps launched when this one is collected
        launched[0] -= 1
        return collect(flight)

    runner.launch, runner.collect = counting_launch, counting_collect
    overlapping = 0
    try:
        for i, prompt in enumerate(tied_ref.prompts):
            engine.add_request(f"r{i}", prompt, GREEDY)
        while engine.has_unfinished():
            engine.step()
            seqs = [seq for flight in engine._in_flight for seq, _ in flight.scheduled]
            overlapping += len(seqs) - len(set(seqs))
    finally:
        engine.shutdown()
    assert at_collect.count(2) > 0.8 * len(at_collect)  # the next step already runs at nearly every collect
    assert overlapping == 0


def test_an_abort_while_its_step_is_in_flight_drops_that_steps_token(tied_ref: Reference) -> None:
    engine = LLMEngine(tied_ref.model_dir, pipeline_parallel_size=2, max_batch_size=8)
    try:
        for i, prompt in enumerate(tied_ref.prompts[:4]):
            engine.add_request(f"r{i}", prompt, GREEDY)
        engine.step()  # r0, r1 launched
        assert {seq.request_id for seq, _ in engine._in_flight[0].scheduled} == {"r0", "r1"}
        engine.abort("r0")
        outs = []
        while engine.has_unfinished():
            outs += engine.step()
    finally:
        engine.shutdown()
    r0 = [o for o in outs if o.request_id == "r0"]
    assert [(o.new_token_ids, o.finish_reason) for o in r0] == [([], "abort")]
    tokens = {
        f"r{i}": [t for o in outs if o.request_id == f"r{i}" for t in o.new_token_ids] for i in (1, 2, 3)
    }
    assert tokens == {f"r{i}": tied_ref.outputs[i] for i in (1, 2, 3)}


@pytest.mark.slow
def test_pp2_x_tp2_over_four_processes_equals_transformers(gqa_ref: Reference) -> None:
    engine = LLMEngine(
        gqa_ref.model_dir,
        pipeline_parallel_size=2,
        tensor_parallel_size=2,
        max_batch_size=8,
        max_num_batched_tokens=64,  # long prompts prefill in chunks beside other sequences' decodes
    )
    try:
        assert len(engine.workers.processes) == 3
        assert list(engine.runner.model.layer_ids) == [0, 1]
        outs, _ = generate_tracking_batch(engine, gqa_ref.prompts, GREEDY)
    finally:
        engine.shutdown()
    assert outs == gqa_ref.outputs


@pytest.mark.slow
def test_pp2_x_ep2_over_four_processes_equals_ep1(tmp_path: Path) -> None:
    ref = make_reference(tmp_path, "mixtral", MIXTRAL)
    engine = LLMEngine(ref.model_dir, pipeline_parallel_size=2, expert_parallel_size=2, max_batch_size=8)
    try:
        got = generate(engine, ref.prompts)
    finally:
        engine.shutdown()
    assert got.tokens == ref.run.tokens


def test_the_runtime_config_runs_pipeline_parallel_stages(tied_ref: Reference) -> None:
    yaml = f"""
model: {{name: tiny, weights_uri: {tied_ref.model_dir}, dtype: float32, max_seq_len: 256}}
batch: {{max_batch_size: 8, max_num_batched_tokens: 256}}
pipeline_parallel_size: 2
device: cpu
"""
    engine = LLMEngine.from_config(parse_config(yaml), tied_ref.model_dir)
    try:
        assert len(engine.workers.processes) == 1
        outs = engine.generate(tied_ref.prompts[:2], GREEDY)
    finally:
        engine.shutdown()
    assert outs == tied_ref.outputs[:2]


# -- the split --------------------------------------------------------------------------------


def test_each_stage_reads_only_its_own_layers(gqa_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    real_read = Checkpoint.read

    def recording_read(self: Checkpoint, name: str, *args: object):  # noqa: ANN202
        read.append(name)
        return real_read(self, name, *args)

    monkeypatch.setattr(Checkpoint, "read", recording_read)
    last = load_model(gqa_dir, placement=Layout(pipeline_parallel=2).placement(rank=1))
    assert list(last.layer_ids) == [2, 3] and last.embed_tokens is None  # untied: no embedding
    assert {int(n.split(".")[2]) for n in read if n.startswith("model.layers.")} == {2, 3}
    assert "model.embed_tokens.weight" not in read and {"model.norm.weight", "lm_head.weight"} <= set(read)
    read.clear()
    first = load_model(gqa_dir, placement=Layout(pipeline_parallel=2).placement(rank=0))
    assert first.norm is None and first.lm_head is None
    assert {int(n.split(".")[2]) for n in read if n.startswith("model.layers.")} == {0, 1}
    assert "lm_head.weight" not in read and "model.norm.weight" not in read


def test_layers_split_into_contiguous_ranges_the_first_stages_taking_the_remainder() -> None:
    layout = Layout(pipeline_parallel=3)
    assert [layout.stage_layers(8, s) for s in range(3)] == [range(0, 3), range(3, 6), range(6, 8)]
    assert [layout.stage_layers(3, s) for s in range(3)] == [range(0, 1), range(1, 2), range(2, 3)]


def test_a_step_splits_into_micro_batches_of_whole_sequences() -> None:
    # Two decodes (rows 0, 1), then a 3-token prefill that samples and a 2-token chunk that does not.
    step = StepInput(
        input_ids=[10, 11, 20, 21, 22, 30, 31],
        rows=[0, 1, 2, 3],
        computed=[5, 7, 0, 4],
        counts=[1, 1, 3, 2],
        num_decodes=2,
        table_updates=[2, 0, 9],
        logits_indices=[0, 1, 4],
    )
    first, second = step.split(2)
    assert (first.input_ids, first.rows, first.num_decodes, first.logits_indices) == (
        [10, 11],
        [0, 1],
        2,
        [0, 1],
    )
    assert first.table_updates == [2, 0, 9] and second.table_updates == []
    assert (second.input_ids, second.rows, second.computed, second.counts) == (
        [20, 21, 22, 30, 31],
        [2, 3],
        [0, 4],
        [3, 2],
    )
    assert (second.num_decodes, second.logits_indices) == (0, [2])
    assert [len(c.rows) for c in step.split(3)] == [2, 1, 1]


def test_more_pipeline_stages_than_layers_are_refused_naming_both(tied_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"pipeline_parallel_size 3 exceeds the model's 2 layers"):
        LLMEngine(tied_dir, pipeline_parallel_size=3)
    assert not multiprocessing.active_children()
