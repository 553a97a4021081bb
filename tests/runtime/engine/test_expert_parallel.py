"""Expert parallelism: experts sharded over real gloo processes give the EP=1 outputs.

Checkpoints are the ones transformers writes for random Mixtral and Qwen2-MoE models (the shapes
of ``test_model_families``). The reference is the single-process engine on the same checkpoint,
itself greedy-equal to transformers there; here the tokens must be identical and the top-5
logprobs of every generated token within float32 rounding.
"""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from engine_fixtures import MAX_NEW, random_fillers
from frontier_runtime.distributed import Layout
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.models.llama import load_model
from frontier_runtime.models.llama.loader import Checkpoint
from frontier_runtime.models.llama.moe import SparseMoE, combine_bytes
from frontier_runtime.requests import SamplingParams
from safetensors import safe_open
from safetensors.torch import save_file
from test_model_families import COMMON, FAMILIES, VOCAB, write_checkpoint

PARAMS = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, logprobs=5)
MIXTRAL = FAMILIES["mixtral"][0]  # 4 experts, top-2, hidden 64, 4 heads / 2 KV heads
QWEN2_MOE = FAMILIES["qwen2_moe"][0]  # 4 experts, top-2 not renormalised, a gated shared expert


@dataclass(frozen=True)
class Run:
    tokens: list[list[int]]
    top: list[list[dict[int, float]]]  # each generated token's top-5 logprobs


@dataclass(frozen=True)
class Reference:
    model_dir: Path
    prompts: list[list[int]]
    run: Run


def generate(engine: LLMEngine, prompts: list[list[int]]) -> Run:
    ids = [f"p{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts, strict=True):
        engine.add_request(rid, prompt, PARAMS)
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    top: dict[str, list[dict[int, float]]] = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            top[out.request_id].extend(lp.top for lp in out.logprobs or [])
    return Run([tokens[r] for r in ids], [top[r] for r in ids])


def run_parallel(model_dir: Path, prompts: list[list[int]], **parallel: int) -> Run:
    engine = LLMEngine(model_dir, max_batch_size=8, **parallel)
    try:
        return generate(engine, prompts)
    finally:
        engine.shutdown()


def assert_equal_runs(got: Run, want: Run) -> None:
    assert got.tokens == want.tokens
    for got_seq, want_seq in zip(got.top, want.top, strict=True):
        for got_top, want_top in zip(got_seq, want_seq, strict=True):
            assert got_top.keys() == want_top.keys()
            for token, logprob in want_top.items():
                assert got_top[token] == pytest.approx(logprob, abs=1e-4)


def make_reference(out: Path, model_type: str, fields: dict[str, object]) -> Reference:
    model_dir = write_checkpoint(out, model_type, seed=10, **fields)
    prompts = random_fillers(8, seed=10, vocab=VOCAB)
    return Reference(model_dir, prompts, generate(LLMEngine(model_dir, max_batch_size=8), prompts))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return make_reference(tmp_path_factory.mktemp("ep-mixtral"), "mixtral", MIXTRAL)


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return make_reference(tmp_path_factory.mktemp("ep-qwen2-moe"), "qwen2_moe", QWEN2_MOE)


# -- equality over gloo processes -------------------------------------------------------------


def test_ep2_over_gloo_equals_ep1_on_a_mixtral_checkpoint(mixtral: Reference) -> None:
    engine = LLMEngine(mixtral.model_dir, max_batch_size=8, expert_parallel_size=2, prefix_caching=False)
    try:
        moe = engine.runner.model.layers[0].mlp
        assert isinstance(moe, SparseMoE)
        assert list(moe.expert_ids) == [0, 1]  # rank 0 holds the first half of the 4 experts, whole
        assert moe.experts[0].down_proj.in_features == MIXTRAL["intermediate_size"]
        got = generate(engine, mixtral.prompts)
        # The combine all-reduces each step's [tokens, hidden] partial sums once per sparse layer.
        tokens = sum(len(p) + MAX_NEW - 1 for p in mixtral.prompts)
        combined = sum(layer.mlp.combined_bytes for layer in engine.runner.model.layers)
        assert combined == tokens * MIXTRAL["hidden_size"] * 4 * COMMON["num_hidden_layers"]
    finally:
        engine.shutdown()
    assert_equal_runs(got, mixtral.run)
    assert all(not p.is_alive() for p in engine.workers.processes)


def test_ep2_over_gloo_equals_ep1_on_a_qwen2_moe_checkpoint_with_a_shared_expert(
    qwen2_moe: Reference,
) -> None:
    # The shared expert's columns split over both ranks; its partial sums join the routed ones'.
    assert_equal_runs(
        run_parallel(qwen2_moe.model_dir, qwen2_moe.prompts, expert_parallel_size=2), qwen2_moe.run
    )


def test_ep2_on_the_ranks_of_tp2_equals_ep1(mixtral: Reference) -> None:
    # Two processes: attention split by heads, the experts by whole experts instead of by columns.
    engine = LLMEngine(mixtral.model_dir, max_batch_size=8, expert_parallel_size=2, tensor_parallel_size=2)
    try:
        assert engine.workers.processes and len(engine.workers.processes) == 1
        assert engine.runner.model.layers[0].self_attn.num_kv_heads == 1
        moe = engine.runner.model.layers[0].mlp
        assert isinstance(moe, SparseMoE) and len(moe.experts) == 2
        assert moe.experts[0].down_proj.in_features == MIXTRAL["intermediate_size"]
        got = generate(engine, mixtral.prompts)
    finally:
        engine.shutdown()
    assert_equal_runs(got, mixtral.run)


@pytest.mark.slow
def test_ep4_over_two_attention_groups_of_tp2_equals_ep1(mixtral: Reference) -> None:
    # Four processes: two tensor-parallel attention groups of two ranks, one expert per rank.
    engine = LLMEngine(mixtral.model_dir, max_batch_size=8, expert_parallel_size=4, tensor_parallel_size=2)
    try:
        assert len(engine.workers.processes) == 3
        moe = engine.runner.model.layers[0].mlp
        assert isinstance(moe, SparseMoE) and list(moe.expert_ids) == [0]
        got = generate(engine, mixtral.prompts)
    finally:
        engine.shutdown()
    assert_equal_runs(got, mixtral.run)


# -- where each rank's experts come from --------------------------------------------------------


def test_a_rank_reads_only_its_own_experts_from_the_checkpoint(
    mixtral: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []
    real_read = Checkpoint.read

    def recording_read(self: Checkpoint, name: str, *args: object) -> torch.Tensor:
        read.append(name)
        return real_read(self, name, *args)

    monkeypatch.setattr(Checkpoint, "read", recording_read)
    model = load_model(mixtral.model_dir, placement=Layout(expert_parallel=2).placement(rank=1))
    experts_read = {name.split(".experts.")[1].split(".")[0] for name in read if ".experts." in name}
    assert experts_read == {"2", "3"}
    moe = model.layers[1].mlp
    assert isinstance(moe, SparseMoE)
    with safe_open(str(mixtral.model_dir / "model.safetensors"), framework="pt") as f:
        w1 = f.get_tensor("model.layers.1.block_sparse_moe.experts.3.w1.weight")
        w3 = f.get_tensor("model.layers.1.block_sparse_moe.experts.3.w3.weight")
        w2 = f.get_tensor("model.layers.1.block_sparse_moe.experts.3.w2.weight")
    torch.testing.assert_close(moe.experts[1].gate_up_proj.dense_weight(), torch.cat([w1, w3]))
    torch.testing.assert_close(moe.experts[1].down_proj.dense_weight(), w2)


@pytest.mark.parametrize(
    ("tp", "ep", "experts", "columns"),
    [
        (1, 2, [0, 1], [(0, 1)] * 2),  # each rank holds its shard whole; attention replicated
        (2, 2, [0, 1], [(0, 1)] * 2),  # EP on the tensor-parallel ranks
        (4, 2, [0, 0, 1, 1], [(0, 2), (1, 2), (0, 2), (1, 2)]),  # each shard's columns over 2 ranks
        (2, 4, [0, 1, 2, 3], [(0, 1)] * 4),  # two attention groups, one shard per rank
    ],
)
def test_expert_shards_and_their_columns_follow_the_stage_ranks(
    tp: int, ep: int, experts: list[int], columns: list[tuple[int, int]]
) -> None:
    layout = Layout(tensor_parallel=tp, expert_parallel=ep)
    placements = [layout.placement(r) for r in range(layout.world_size)]
    assert [p.experts.rank for p in placements] == experts
    assert [(p.expert_columns.rank, p.expert_columns.world_size) for p in placements] == columns
    assert all(p.tp.world_size == tp and p.stage.world_size == max(tp, ep) for p in placements)


def test_the_cpu_budget_splits_over_every_rank_of_the_replica(mixtral: Reference) -> None:
    # Stages of max(TP, EP) ranks: EP 2 x PP 2 is four processes, one thread each of four.
    config = EngineConfig(mixtral.model_dir, cpu_threads=4, expert_parallel_size=2, pipeline_parallel_size=2)
    assert (config.ranks, config.threads_per_rank) == (4, 1)
    assert config.updated(tensor_parallel_size=2).ranks == 4  # EP on the tensor-parallel ranks
    assert config.updated(expert_parallel_size=4, pipeline_parallel_size=1).threads_per_rank == 1


def test_the_combine_moves_a_ring_all_reduce_of_the_tokens_hidden_states() -> None:
    # 2 (G - 1) / G of [tokens, hidden] per rank: 8 decode tokens x 4096 x bf16 over 2 ranks.
    assert combine_bytes(tokens=8, hidden=4096, itemsize=2, ranks=2) == 8 * 4096 * 2
    assert combine_bytes(tokens=8, hidden=4096, itemsize=2, ranks=8) == 2 * 7 * 8 * 4096 * 2 // 8


# -- bad input, refused before any process starts or weight is read -----------------------------


@pytest.mark.parametrize("ep", [3, 8])
def test_an_ep_size_that_does_not_divide_the_experts_is_refused(mixtral: Reference, ep: int) -> None:
    refused = rf"expert_parallel_size {ep} must divide the model's 4 experts \(num_experts\)"
    with pytest.raises(ValueError, match=refused):
        LLMEngine(mixtral.model_dir, expert_parallel_size=ep)
    assert not multiprocessing.active_children()


def test_expert_parallelism_on_a_dense_model_is_refused(tied_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"expert_parallel_size 2: model_type 'llama' is dense"):
        LLMEngine(tied_dir, expert_parallel_size=2)


def test_ep_and_tp_sizes_that_are_not_multiples_of_each_other_are_refused(mixtral: Reference) -> None:
    refused = (
        r"expert_parallel_size 4 and tensor_parallel_size 3: the larger must be a multiple of the smaller"
    )
    with pytest.raises(ValueError, match=refused):
        LLMEngine(mixtral.model_dir, expert_parallel_size=4, tensor_parallel_size=3)


def test_a_router_that_does_not_match_the_config_is_refused_before_any_process_starts(
    tmp_path: Path, mixtral: Reference
) -> None:
    # The checkpoint holds the routers alone: any weight read would fail on the missing embedding.
    config = json.loads((mixtral.model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    routers = {f"model.layers.{i}.block_sparse_moe.gate.weight": torch.zeros(6, 64) for i in range(2)}
    save_file(routers, str(tmp_path / "model.safetensors"))
    refused = (
        r"model\.layers\.0\.block_sparse_moe\.gate\.weight has shape \(6, 64\) but config\.json says "
        r"num_experts 4 x hidden_size 64 \(4, 64\)"
    )
    with pytest.raises(ValueError, match=refused):
        LLMEngine(tmp_path, expert_parallel_size=2)
    assert not multiprocessing.active_children()
