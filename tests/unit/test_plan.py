"""The capacity planner against numbers worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from frontier.capacity.baseline import Baseline
from frontier.capacity.plan import plan_stack, replicas_for_peak
from frontier.config.memory import kv_bytes_per_token
from frontier.targets import load_stack


@pytest.fixture(scope="module")
def prod():
    return load_stack("prod")


def _baseline(stack: str, qps: float, tokens_per_s: float) -> Baseline:
    return Baseline(
        stack=stack,
        measured_at="2026-11-30T10:00:00Z",
        replica_qps=qps,
        output_tokens_per_s=tokens_per_s,
        p50_latency_ms=900.0,
        p99_latency_ms=4000.0,
        ttft_p99_ms=700.0,
        hosts_measured=2,
        release_id="r-abc123",
    )


# Llama-3.1-70B: 80 layers, hidden 8192, 64 heads (head_dim 128), 8 KV heads, MLP 28672, vocab 128256.
# Per layer: q,o 2 x 8192^2 + k,v 2 x 8192 x 1024 + MLP 3 x 8192 x 28672 + 2 norms x 8192 = 855,654,400;
# x 80 = 68,452,352,000; + embeddings and LM head 2 x 128256 x 8192 = 2,101,346,304; + final norm 8192.
LLAMA_70B_PARAMETERS = 70_553_706_496


def test_parameters_of_a_70b_llama(prod):
    assert prod.model.num_parameters == LLAMA_70B_PARAMETERS


def test_70b_bf16_weights_are_141_gb_and_17_6_gb_per_gpu_at_tp8(prod):
    memory = plan_stack(prod, prod.only_pool, None).groups[0].memory
    assert memory.weights_bytes == LLAMA_70B_PARAMETERS * 2 == 141_107_412_992  # ~141.1 GB
    assert memory.weights_per_gpu_bytes == 141_107_412_992 / 8 == 17_638_426_624  # ~17.6 GB


def test_kv_bytes_per_token_is_2_x_layers_x_kv_heads_x_head_dim_x_bytes(prod):
    # 2 (K and V) x 80 layers x 8 KV heads x 128 head_dim x 2 bytes (bf16)
    assert kv_bytes_per_token(prod.model, 2) == 2 * 80 * 8 * 128 * 2 == 327_680


def test_kv_bytes_per_token_per_gpu_splits_kv_heads_over_tensor_parallel(prod):
    assert kv_bytes_per_token(prod.model, 2, tensor_parallel=8) == 327_680 // 8 == 40_960


def test_kv_heads_are_replicated_when_tensor_parallel_exceeds_them(prod):
    # 16 ranks, 8 KV heads: each rank holds one head (two ranks share it), not half a head.
    assert kv_bytes_per_token(prod.model, 2, tensor_parallel=16) == 40_960


def test_kv_bytes_per_token_per_gpu_splits_layers_over_pipeline_stages(prod):
    assert kv_bytes_per_token(prod.model, 2, tensor_parallel=4, pipeline_parallel=2) == 2 * 40 * 2 * 128 * 2


def test_prod_memory_breakdown(prod):
    m = plan_stack(prod, prod.only_pool, None).groups[0].memory
    assert m.budget_bytes == pytest.approx(0.9 * 80e9)  # 72 GB
    assert m.kv_tokens_required == 128 * 8192 == 1_048_576
    assert m.kv_required_bytes == 1_048_576 * 40_960  # 42.95 GB
    assert m.reserved_bytes == 4e9
    # 72 GB - 17.638 GB weights - 4 GB reserved = 50.36 GB for KV, / 40,960 B per token
    assert m.kv_capacity_tokens == int((72e9 - 17_638_426_624 - 4e9) // 40_960) == 1_229_530
    assert m.headroom_bytes == pytest.approx(72e9 - 17_638_426_624 - 1_048_576 * 40_960 - 4e9)
    assert m.fits


def test_replicas_are_the_peak_with_safety_factor_over_per_replica_qps():
    assert replicas_for_peak(40, 1.4, 12) == 5  # 56 / 12 = 4.67
    assert replicas_for_peak(40, 1.4, 14) == 4  # exactly 4, despite 1.4 not being exact in binary
    assert replicas_for_peak(0.1, 1.3, 100) == 1


def test_prod_replicas_nodes_and_cost_from_the_assumption(prod):
    plan = plan_stack(prod, prod.only_pool, None)
    assert plan.throughput.source == "assumption"
    assert "ASSUMPTION" in plan.throughput.explanation
    g = plan.groups[0]
    assert g.demand_qps == pytest.approx(56.0)  # 40 req/s x 1.4
    assert g.replicas_for_peak == 5  # ceil(56 / 12)
    assert g.spare.hosts == 1 and g.spare.replicas == 1
    assert "rollout.max_surge = 1" in g.spare.reason
    assert g.replicas == 6
    assert g.gpus_per_replica == 8 and g.replicas_per_node == 1 and g.idle_gpus_per_node == 0
    assert g.nodes == 6
    assert g.cost_per_hour == pytest.approx(6 * 98.32)  # $589.92
    # one replica: $98.32/h for 12 req/s x 350 tokens = 4,200 tokens/s = 15.12M tokens/h
    assert g.cost_per_million_output_tokens == pytest.approx(98.32 / 15.12)  # $6.50
    # whole fleet at the peak: $589.92/h for 40 x 350 x 3600 = 50.4M tokens/h
    assert g.fleet_cost_per_million_output_tokens == pytest.approx(589.92 / 50.4)  # $11.70
    assert g.warnings == ()


def test_measured_baseline_replaces_the_assumption(prod):
    plan = plan_stack(prod, prod.only_pool, _baseline("prod", qps=20, tokens_per_s=7000))
    assert plan.throughput.source == "baseline"
    assert "r-abc123" in plan.throughput.explanation
    g = plan.groups[0]
    assert g.replicas_for_peak == 3  # ceil(56 / 20)
    assert g.nodes == 4
    assert g.cost_per_million_output_tokens == pytest.approx(98.32 / (7000 * 3600) * 1e6)  # $3.90


def test_spare_is_the_rollout_batch_when_it_exceeds_the_surge():
    local = load_stack("local")  # batch_size 1, max_surge 0
    g = plan_stack(local, local.only_pool, None).groups[0]
    assert g.spare.hosts == 1
    assert g.spare.reason == "rollout.batch_size = 1 (> rollout.max_surge = 0)"


def test_several_replicas_per_node_share_the_node_and_its_spare():
    staging = load_stack("staging")  # 4 x L40S per node, TP 2
    g = plan_stack(staging, staging.only_pool, None).groups[0]
    assert g.replicas_per_node == 2
    assert g.replicas_for_peak == 2  # ceil(8 x 1.3 / 6) = ceil(1.73)
    assert g.spare.replicas == 2  # one host out = two replicas
    assert g.nodes == 2
    assert g.replica_cost_per_hour == pytest.approx(10.49 / 2)


def test_idle_gpus_are_paid_for_by_the_replicas():
    prod = load_stack("prod")
    # Planner arithmetic only: 3-GPU replicas on an 8-GPU node leave two GPUs idle.
    three_gpus = prod.with_pool(
        prod.only_pool.model_copy(
            update={"runtime": prod.runtime.model_copy(update={"tensor_parallel_size": 3})}
        )
    )
    g = plan_stack(three_gpus, three_gpus.only_pool, None).groups[0]
    assert g.replicas_per_node == 2 and g.idle_gpus_per_node == 2
    assert g.replica_cost_per_hour == pytest.approx(98.32 / 2)


def test_a_plan_beyond_the_group_size_warns():
    dev = load_stack("dev")  # one node, but a rollout needs a second to keep serving
    g = plan_stack(dev, dev.only_pool, None).groups[0]
    assert g.nodes == 2
    assert g.warnings == ("the plan needs 2 nodes but node group 'a10g' has desired_size = 1",)
    big = dev.model_copy(update={"capacity": dev.capacity.model_copy(update={"peak_qps": 100})})
    assert "has max_size = 2" in plan_stack(big, big.only_pool, None).groups[0].warnings[0]


def test_plan_is_pure(prod):
    baseline = _baseline("prod", 20, 7000)
    assert plan_stack(prod, prod.only_pool, baseline) == plan_stack(
        prod, prod.only_pool, dataclasses.replace(baseline)
    )
