"""`fab plan --explore`: the sweep, its Pareto front, what it drops and why, and its chart."""

from __future__ import annotations

import pytest
from fab_program import fab

from frontier import project
from frontier.capacity.explore import (
    candidates,
    explore,
    kv_dtypes_to_sweep,
    pareto_front,
    runtime_kv_cache_dtypes,
    variant,
)
from frontier.capacity.replica import model_stack
from frontier.config.checks import cross_check
from frontier.errors import FrontierError, StackError
from frontier.targets import load_stack, stack_problems


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch, stacks_copy):
    monkeypatch.chdir(project.root())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))
    monkeypatch.delenv("FRONTIER_STACK", raising=False)


@pytest.fixture
def prod():
    return load_stack("prod")


# The sweep asks the runtime which KV cache dtypes it accepts; most tests pin the answer so their
# counts do not depend on it.
WITHOUT_FP8 = ("auto", "bfloat16", "float16", "float32")
WITH_FP8 = (*WITHOUT_FP8, "fp8")


@pytest.fixture
def prod_explored(prod):
    return explore(
        prod, prod.only_pool, model_stack(prod, prod.only_pool, None), WITHOUT_FP8, rules=stack_problems
    )


def test_every_candidate_is_an_option_or_dropped_for_a_counted_reason(prod_explored):
    ex = prod_explored
    assert ex.considered == len(candidates(load_stack("prod").only_pool))
    assert len(ex.options) + sum(n for _, n in ex.dropped) == ex.considered
    reasons = dict(ex.dropped)
    assert reasons["memory: weights + KV cache for max_batch_size x max_seq_len exceed the GPU's budget"] > 0
    # TP 2, 4 and 8 on the single-GPU instance types (g5/g6/g6e.xlarge) x 6 batch sizes each, and
    # TP 8 on the 4-GPU ones: 3 x 3 x 6 + 3 x 1 x 6 = 72
    assert reasons["topology: tensor parallel needs more GPUs than a node has"] == 72


def test_a_dropped_candidate_breaks_the_stack_checks_and_an_option_passes_them(prod, prod_explored):
    by_label = {c.label: c for c in candidates(prod.only_pool)}
    too_big = variant(
        prod, prod.only_pool, by_label["g5.xlarge TP1 mbs8"]
    )  # 141 GB of weights on a 24 GB GPU
    assert [p.path for p in cross_check(too_big)] == ["node_groups[0].gpu_memory_gb"]
    option = prod_explored.options[0]
    assert list(cross_check(variant(prod, prod.only_pool, option.candidate))) == []


def test_the_front_is_cheapest_first_and_nothing_beats_it_on_both_axes(prod_explored):
    ex = prod_explored
    costs = [o.cost_per_million for o in ex.front]
    tpots = [o.tpot_ms for o in ex.front]
    assert costs == sorted(costs) and tpots == sorted(tpots, reverse=True)
    for f in ex.front:
        assert not any(o.cost_per_million < f.cost_per_million and o.tpot_ms < f.tpot_ms for o in ex.options)
    assert ex.cheapest.cost_per_million == min(o.cost_per_million for o in ex.options)


def test_every_option_meets_every_slo(prod, prod_explored):
    for o in prod_explored.options:
        assert o.point.ttft_s * 1e3 <= prod.slo.ttft_ms
        assert o.point.tpot_s * 1e3 <= prod.slo.tpot_ms
        assert o.point.e2e_s * 1e3 <= prod.slo.p99_latency_ms


def test_the_current_choice_is_marked_and_sized_like_the_roofline_plan(prod, prod_explored):
    current = prod_explored.current
    assert current is not None and current.current
    assert current.candidate.label == "p5.48xlarge TP8 mbs128"
    model = model_stack(prod, prod.only_pool, None)
    assert current.point == model.fit.best
    assert current.plan.group.price_per_hour == 98.32  # the stack's own price


def test_pareto_front_keeps_the_lower_tpot_on_a_cost_tie(prod_explored):
    options = list(prod_explored.options)
    front = pareto_front(options + options)  # duplicates change nothing
    assert front == prod_explored.front


def test_a_sweep_with_nothing_feasible_counts_each_reason(prod):
    impossible = prod.model_copy(update={"slo": prod.slo.model_copy(update={"tpot_ms": 1})})
    with pytest.raises(FrontierError) as err:
        explore(
            impossible,
            impossible.only_pool,
            model_stack(prod, prod.only_pool, None),
            WITHOUT_FP8,
            rules=stack_problems,
        )
    message = str(err.value)
    assert "none of the 312 candidates" in message
    assert "x memory: weights + KV cache" in message
    assert "72 x topology: tensor parallel needs more GPUs than a node has" in message
    assert "x SLO: one request at a time already breaks slo.tpot_ms" in message


def test_an_slo_of_zero_is_refused_when_the_stack_loads(changed_stack):
    for field in ("slo.ttft_ms", "slo.tpot_ms", "slo.p99_latency_ms"):
        changed_stack("prod", {field: 0})
        with pytest.raises(StackError, match=rf"{field} = 0: Input should be greater than 0"):
            load_stack("prod")
        changed_stack("prod", {field: 1000})


def test_the_sweep_asks_the_engine_whether_it_takes_an_fp8_kv_cache(prod, tmp_path):
    from frontier_runtime.engine.config import EngineConfig

    accepted = runtime_kv_cache_dtypes()
    try:
        EngineConfig(model_dir=tmp_path, dtype="float32", kv_cache_dtype="fp8")
        engine_takes_fp8 = True
    except ValueError:
        engine_takes_fp8 = False
    assert ("fp8" in accepted) == engine_takes_fp8
    swept, note = kv_dtypes_to_sweep(prod.only_pool, accepted)
    assert swept == (("bfloat16", "fp8") if engine_takes_fp8 else ("bfloat16",))
    assert note.startswith("kv_cache_dtype swept" if engine_takes_fp8 else "kv_cache_dtype is not swept")


def test_without_fp8_the_note_says_why_the_kv_dtype_is_not_swept(prod):
    swept, note = kv_dtypes_to_sweep(prod.only_pool, WITHOUT_FP8)
    assert swept == ("bfloat16",)
    assert note == (
        "kv_cache_dtype is not swept: the runtime refuses fp8 (it accepts auto, bfloat16, float16, float32) "
        "and the others are no narrower than the model's dtype"
    )


def test_an_fp8_kv_cache_halves_the_kv_bytes_so_larger_batches_fit(prod):
    ex = explore(
        prod, prod.only_pool, model_stack(prod, prod.only_pool, None), WITH_FP8, rules=stack_problems
    )
    assert ex.considered == 2 * 312
    by_label = {c.label: c for c in candidates(prod.only_pool, ("bfloat16", "fp8"))}
    # p5.48xlarge TP8 at 256 sequences x 8192 tokens: 85.9 GB of bf16 KV per GPU does not fit 72 GB;
    # in fp8 it is 42.9 GB, which does.
    assert [
        p.path for p in cross_check(variant(prod, prod.only_pool, by_label["p5.48xlarge TP8 mbs256"]))
    ] == ["node_groups[0].gpu_memory_gb"]
    assert list(cross_check(variant(prod, prod.only_pool, by_label["p5.48xlarge TP8 mbs256 kv-fp8"]))) == []
    fp8 = {o.candidate.label: o for o in ex.options}["p5.48xlarge TP8 mbs128 kv-fp8"]
    assert fp8.point.mean_step.kv_bytes < ex.current.point.mean_step.kv_bytes
    assert ex.current.candidate.kv_cache_dtype == "bfloat16"  # the stack's own stays marked


@pytest.mark.slow
def test_fab_plan_explore_prints_the_front_and_writes_the_chart(capsys, tmp_path):
    png = tmp_path / "front.png"
    code, out, err = fab(capsys, "plan", "-s", "prod", "--explore", "--png", str(png))
    assert code == 0, err
    assert "ASSUMPTION" in out  # the tables from before stay as they were
    assert "roofline: one replica at each concurrency" in out
    assert "roofline: which figures are modelled and which measured" in out
    assert "node group h100: replicas, nodes and cost (from the roofline)" in out
    assert "explore: Pareto front of cost per 1M output tokens vs TPOT, stack prod" in out
    assert "cheapest" in out and "current" in out
    assert "x kv_cache_dtype x model.quantization none/int8/fp8;" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart: {png}" in out
    # Colocated beside prefill/decode halves, and the pick with its reason: prod's 70B is not split.
    assert "explore: colocated vs prefill/decode (P/D) for pool llama-3.1-70b-instruct" in out
    assert (
        "layout: colocated on p5.48xlarge TP8 mbs128: P/D is not offered (P/D moves one rank's KV cache"
        in out
    )
    # The quality axis: a row per weights x KV variant, unmeasured unless --quality asks.
    assert "explore: price vs pass rate by weights and KV cache dtype, stack prod" in out
    assert "not measured (--quality)" in out
    assert (tmp_path / "front-quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fab_plan_on_an_unknown_gpu_type_names_the_field_and_the_known_types(capsys, changed_stack):
    changed_stack("prod", {"node_groups[0].gpu_type": "B200-192GB"})
    code, _, err = fab(capsys, "plan", "-s", "prod")
    assert code == 2
    assert "node_groups[0].gpu_type = 'B200-192GB': unknown GPU type; known types: A100-SXM4-40GB" in err


def test_fab_plan_models_a_pipeline_parallel_replica(capsys, changed_stack):
    changed_stack("prod", {"runtime.tensor_parallel_size": 4, "runtime.pipeline_parallel_size": 2})
    code, out, err = fab(capsys, "plan", "-s", "prod")
    assert code == 0, err
    assert "roofline: one replica at each concurrency" in out
    assert "not modelled" not in out
