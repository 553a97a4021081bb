"""The roofline's mixture-of-experts, expert-parallel and pipeline-parallel terms, worked by hand.

Efficiencies are pinned at 1 (or at the figures named in each test) so every number below can be
checked with a pencil.
"""

from __future__ import annotations

import pytest

from frontier.capacity.explore import candidates, expert_parallel_sweep, variant
from frontier.capacity.plan import Throughput, plan_with
from frontier.capacity.replica import model_stack
from frontier.capacity.roofline import (
    Device,
    Efficiency,
    Replica,
    Shape,
    alltoall_s,
    busiest_rank_experts,
    expert_gemm_rows,
    experts_touched,
    pipeline_bubble,
    serial_experts_s,
    stage_send_s,
    step,
)
from frontier.errors import FrontierError, StackError
from frontier.targets import load_stack, stack_problems

US = 1e-6

# Link 450 GB/s (NVLink 4, one direction) at 70 %: 315 GB/s; NCCL ~10 us inside, 30 us over EFA.
EFF = Efficiency(
    bandwidth=1.0,
    flops=1.0,
    link=0.7,
    allreduce_latency_s=10e-6,
    step_overhead_s=0.0,
    seq_overhead_s=0.0,
    source="test",
    network_latency_s=30e-6,
)
H200 = Device(
    name="H200", memory_bytes=141e9, bandwidth=1e12, flops=1e15, link_bandwidth=450e9, source="test"
)

# A small MoE: 4 layers, hidden 1024, 8 heads of 128 (KV 8), 8 experts of width 2048, top-2.
SMALL = Shape(
    layers=4,
    hidden=1024,
    intermediate=4096,
    heads=8,
    kv_heads=8,
    vocab=32000,
    dtype_bytes=2,
    experts=8,
    experts_per_token=2,
    expert_intermediate=2048,
    expert_load_imbalance=1.2,
)
# Qwen3-MoE-235B-sized: 94 layers, hidden 4096, 128 experts, top-8.
BIG = Shape(
    layers=94,
    hidden=4096,
    intermediate=12288,
    heads=32,
    kv_heads=4,
    vocab=151936,
    dtype_bytes=2,
    experts=128,
    experts_per_token=8,
    expert_intermediate=1536,
    expert_load_imbalance=1.2,
)


def _replica(shape: Shape, tp: int = 1, ep: int = 1, pp: int = 1, network: float = 0.0) -> Replica:
    return Replica(
        shape=shape,
        tensor_parallel=tp,
        kv_bytes_per_token_per_gpu=0,
        max_batch_size=64,
        max_num_batched_tokens=8192,
        max_concurrency=64,
        chunked_prefill=True,
        pipeline_parallel=pp,
        expert_parallel=ep,
        nvlink_domain_gpus=8,
        network_bandwidth=network,
    )


def test_distinct_experts_touched_by_a_batch():
    """E (1 - (1 - k/E)^B) with E = 8, k = 2: one token hits 8 x (1 - 0.75) = 2 experts; two hit
    8 x (1 - 0.5625) = 3.5; four 8 x (1 - 0.31640625) = 5.46875; a thousand all 8 but for 1e-125."""
    assert experts_touched(8, 2, 1) == pytest.approx(2.0)
    assert experts_touched(8, 2, 2) == pytest.approx(3.5)
    assert experts_touched(8, 2, 4) == pytest.approx(5.46875)
    assert experts_touched(8, 2, 1000) == pytest.approx(8.0)
    assert experts_touched(8, 2, 0) == 0.0


def test_the_busiest_expert_rank_carries_the_imbalance_up_to_what_it_holds():
    """EP 4 of 8 experts (2 per rank), imbalance 1.2: two tokens touch 3.5 experts, the busiest rank
    3.5 / 4 x 1.2 = 1.05 of them; 64 tokens touch all 8, 8 / 4 x 1.2 = 2.4, capped at the 2 it holds.
    EP 1 holds every expert: no rank to be busier than another."""
    assert busiest_rank_experts(SMALL, 4, 2) == pytest.approx(1.05)
    assert busiest_rank_experts(SMALL, 4, 64) == pytest.approx(2.0)
    assert busiest_rank_experts(SMALL, 1, 2) == pytest.approx(3.5)


def test_a_moe_decode_step_reads_the_dense_weights_and_only_the_experts_it_hits():
    """One token, TP 1, EP 1, no context, 1 TB/s:
    dense = 4 x (attention 2 x 1024^2 + 2 x 1024 x 8 x 128 = 4,194,304 + router 1024 x 8 = 8,192)
    + LM head 32,000 x 1024 = 49,577,984 parameters = 99,155,968 B;
    experts = 4 layers x 2 touched x 3 x 1024 x 2048 (6,291,456) x 2 B = 100,663,296 B;
    199,819,264 B / 1e12 B/s = 199.82 us (reading all 8 experts would be 502.5 us).
    FLOPs: 2 x 49,577,984 + 2 x 6,291,456 x 4 layers x 1 token x 2 experts = 199,819,264.
    Four tokens touch 5.46875 experts: 4 x 5.46875 x 12,582,912 B + 99,155,968 B = 374,407,168 B."""
    replica = _replica(SMALL)
    one = step(H200, EFF, replica, decode_seqs=1, context=0)
    assert SMALL.dense_parameters == 49_577_984
    assert SMALL.expert_parameters == 6_291_456
    assert one.weight_bytes == pytest.approx(199_819_264)
    assert one.memory_s == pytest.approx(199.819264 * US)
    assert one.flops == pytest.approx(199_819_264)
    assert one.alltoall_s == 0.0
    four = step(H200, EFF, replica, decode_seqs=4, context=0)
    assert four.weight_bytes == pytest.approx(374_407_168)


def test_expert_parallel_all_to_all_inside_the_nvlink_domain():
    """TP 8 = EP 8 on one node, 64 tokens, top-8, hidden 4096, bf16: each GPU sends
    64 x 8 / 8 = 64 copies x 4096 x 2 B x 2 (dispatch + combine) x 7/8 = 917,504 B;
    / 315 GB/s = 2.913 us, + 2 phases x 10 us = 22.913 us per MoE layer."""
    t = alltoall_s(H200, EFF, _replica(BIG, tp=8, ep=8), 64)
    assert t == pytest.approx(917_504 / 315e9 + 20 * US)
    assert t == pytest.approx(22.913 * US, rel=1e-4)


def test_expert_parallel_all_to_all_across_nodes_runs_at_the_network():
    """TP 8, EP 16 over two 8-GPU domains, 128 tokens (two attention groups of 64), p5e's EFA
    3,200 Gbit/s / 8 GPUs = 50 GB/s per GPU, x 0.7 = 35 GB/s. Each GPU sends
    128 x 8 / 16 = 64 copies x 4096 x 2 B x 2 x 15/16 = 983,040 B; of its 15 peers 7 share its
    domain, 8 do not: 524,288 B cross the network (14.980 us) while 458,752 B take NVLink (1.456 us);
    the slower sets the time, + 2 x 30 us: 74.980 us per MoE layer, 3.3 x the in-node layer above."""
    t = alltoall_s(H200, EFF, _replica(BIG, tp=8, ep=16, network=50e9), 128)
    assert t == pytest.approx(524_288 / 35e9 + 60 * US)
    assert t == pytest.approx(74.980 * US, rel=1e-4)


def test_leaving_the_domain_without_a_known_network_is_an_error_naming_the_numbers():
    with pytest.raises(
        FrontierError, match=r"expert_parallel = 16 over 16 GPUs leaves the NVLink domain of 8"
    ):
        alltoall_s(H200, EFF, _replica(BIG, tp=8, ep=16), 128)


def test_pipeline_bubble():
    """(PP - m) / PP with m steps in flight: 4 stages with a step each never wait; 4 stages with 3
    steps wait a quarter of the time; 2 stages with one sequence (one step) take turns: half."""
    assert pipeline_bubble(4, 4) == 0.0
    assert pipeline_bubble(4, 3) == pytest.approx(1 / 4)
    assert pipeline_bubble(2, 1) == pytest.approx(1 / 2)
    assert pipeline_bubble(1, 8) == 0.0
    with pytest.raises(FrontierError, match="pipeline_parallel = 0, microbatches = 3"):
        pipeline_bubble(0, 3)


def test_a_pipeline_rereads_the_stage_per_step_in_flight_and_waits_for_none():
    """TP 4 x PP 2 of the small model (8 GPUs, one NVLink domain), 4 decoding sequences: m = 2 steps
    in flight (one per stage) of 2 sequences each, each reading the stage's dense weights
    99,155,968 / 8 = 12,394,496 B and the experts its two tokens hit (2 layers x 12,582,912 B x the
    expected experts of 2 tokens over 4 GPUs); no bubble. Each step sends 2 tokens x 1024 x 2 B / 4
    GPUs = 1,024 B to the next stage: 3.3 ns + 10 us."""
    replica = _replica(SMALL, tp=4, pp=2)
    st = step(H200, EFF, replica, decode_seqs=4, context=0)
    assert st.microbatches == 2
    experts = busiest_rank_experts(SMALL, 1, 2)
    assert st.weight_bytes == pytest.approx(2 * (12_394_496 + 2 * experts * 12_582_912 / 4))
    assert st.bubble_s == 0.0
    assert stage_send_s(H200, EFF, replica, 2) == pytest.approx(1024 / 315e9 + 10 * US)


def test_a_single_sequence_crosses_the_stages_in_turn():
    """One decoding sequence over PP 2: one step in flight, so each stage idles while the other works:
    the bubble equals the busy time (half the round)."""
    st = step(H200, EFF, _replica(SMALL, tp=4, pp=2), decode_seqs=1, context=0)
    assert st.microbatches == 1
    assert st.bubble_s / (st.total_s - st.overhead_s) == pytest.approx(1 / 2)


def test_bad_layouts_name_the_numbers():
    with pytest.raises(FrontierError, match="expert_parallel = 16: must divide the model's 8 experts"):
        _replica(SMALL, tp=1, ep=16)
    with pytest.raises(FrontierError, match="expert_parallel = 3: must divide the model's 8 experts"):
        _replica(SMALL, tp=1, ep=3)
    with pytest.raises(FrontierError, match="pipeline_parallel = 5: more stages than the model's 4 layers"):
        _replica(SMALL, pp=5)
    with pytest.raises(FrontierError, match="experts_per_token = 9: must lie in 1 .. experts"):
        Shape(**{**SMALL.__dict__, "experts_per_token": 9})


@pytest.mark.parametrize(
    ("changes", "named", "rule"),
    [
        ({"runtime.expert_parallel_size": 256}, "runtime.expert_parallel_size = 256", "(128)"),
        (
            {"runtime.expert_parallel_size": 6},
            "runtime.expert_parallel_size = 6",
            "must divide model.num_experts (128)",
        ),
        (
            {"runtime.expert_parallel_size": 16},
            "runtime.expert_parallel_size = 16",
            "must stay inside one NVLink domain: node group 'h200' has nvlink_domain_gpus = 8",
        ),
        (
            {"model.num_layers": 6, "runtime.tensor_parallel_size": 1, "runtime.pipeline_parallel_size": 8},
            "runtime.pipeline_parallel_size = 8",
            "must divide model.num_layers (6)",
        ),
        (
            {"model.num_experts_per_token": 200},
            "model.num_experts_per_token = 200",
            "must be <= model.num_experts (128)",
        ),
    ],
    ids=[
        "EP above the experts",
        "EP not dividing",
        "EP across the NVLink domain",
        "PP above the layers",
        "top-k",
    ],
)
def test_a_moe_stack_with_a_bad_layout_is_refused_at_load(changed_stack, changes, named, rule):
    path = changed_stack("moe-prod", changes)
    with pytest.raises(StackError) as err:
        load_stack("moe-prod", path=path)
    lines = [line for line in str(err.value).splitlines() if named in line]
    assert lines and any(rule in line for line in lines), str(err.value)


def test_the_explore_sweep_crosses_ep_and_pp_for_a_moe_model():
    settings = load_stack("moe-prod")
    layouts = {
        (c.tensor_parallel, c.pipeline_parallel, c.expert_parallel) for c in candidates(settings.only_pool)
    }
    assert {(8, 1, 1), (8, 1, 8), (4, 2, 4), (2, 2, 2)} <= layouts
    assert all(ep <= tp for tp, _, ep in layouts)
    dense = load_stack("prod")
    assert {(c.pipeline_parallel, c.expert_parallel) for c in candidates(dense.only_pool)} == {(1, 1)}


def test_cost_rises_when_expert_parallel_leaves_the_nvlink_domain():
    """moe-prod (TP 8 on p5e, 8-GPU NVLink domain): EP 8 keeps the all-to-all on NVLink; EP 16 and 32
    spread the experts over 2 and 4 nodes and halve the expert weights per GPU each time, but the
    all-to-all then crosses EFA at 50 GB/s per GPU, and each step pays more than the halved reads save."""
    settings = load_stack("moe-prod")
    rows = {
        r.expert_parallel: r
        for r in expert_parallel_sweep(
            settings,
            settings.only_pool,
            model_stack(settings, settings.only_pool, None),
            rules=stack_problems,
        )
    }
    inside, across, wider = rows[8], rows[16], rows[32]
    assert inside.inside_nvlink and inside.rules == "ok"
    assert not across.inside_nvlink and across.nodes == 2 and wider.nodes == 4
    assert "must stay inside one NVLink domain" in across.rules
    assert across.weights_gb_per_gpu < inside.weights_gb_per_gpu
    assert across.alltoall_ms > 3 * inside.alltoall_ms
    assert inside.cost_per_million is not None and across.cost_per_million is not None
    assert wider.cost_per_million is not None
    assert inside.cost_per_million < across.cost_per_million < wider.cost_per_million


def test_a_replica_over_two_nodes_pays_for_both():
    """EP 16 with TP 8: 16 GPUs = 2 p5e nodes per replica at $113/h each; 7 req/s and 2,000 tok/s
    per replica at a peak of 20 x 1.4 = 28 req/s: 4 replicas + 1 spare = 5 replicas = 10 nodes;
    one replica costs $226/h: 226 / (2,000 x 3,600) x 1e6 = $31.39 per 1M output tokens."""
    settings = load_stack("moe-prod")
    wide = settings.with_pool(
        settings.only_pool.model_copy(
            update={"runtime": settings.runtime.model_copy(update={"expert_parallel_size": 16})}
        )
    )
    group = plan_with(wide, wide.only_pool, Throughput(7.0, 2000.0, "roofline", None)).groups[0]
    assert (group.gpus_per_replica, group.nodes_per_replica) == (16, 2)
    assert (group.replicas, group.nodes) == (5, 10)
    assert group.cost_per_million_output_tokens == pytest.approx(226 / (2000 * 3600) * 1e6)


def test_a_replica_spread_wider_than_it_must_pays_for_every_node_it_spans():
    """The same 16 GPUs over 4 nodes (4 GPUs on each, 4 idle): 5 replicas = 20 nodes, $452/h a replica."""
    settings = load_stack("moe-prod")
    rt = settings.runtime.model_copy(update={"expert_parallel_size": 16, "nodes_per_replica": 4})
    wide = settings.only_pool.model_copy(update={"runtime": rt})
    group = plan_with(settings.with_pool(wide), wide, Throughput(7.0, 2000.0, "roofline", None)).groups[0]
    assert (group.nodes_per_replica, group.nodes, group.idle_gpus_per_node) == (4, 20, 4)
    assert group.cost_per_million_output_tokens == pytest.approx(4 * 113 / (2000 * 3600) * 1e6, rel=0.01)


def test_the_stack_s_own_layout_is_a_candidate_of_its_sweep():
    settings = load_stack("moe-prod")
    own = [c for c in candidates(settings.only_pool) if c.label == "p5e.48xlarge TP8 EP8 mbs64"]
    assert len(own) == 1
    assert variant(settings, settings.only_pool, own[0]).runtime.expert_parallel_size == 8


# The CPU engine's sparse layer: one GEMM per expert in use, one after another, in 8-row tiles.
CPU = Device(name="CPU", memory_bytes=16e9, bandwidth=20e9, flops=100e9, link_bandwidth=20e9, source="test")
SERIAL = Efficiency(1.0, 1.0, 1.0, 0.0, 0.0, 0.0, "test", expert_gemms="serial", gemm_row_tile=8)


def test_expert_gemm_rows_with_a_tile_of_one_are_the_routed_token_copies():
    """No padding: B tokens x k copies, whatever the spread (what the GPU roofline counts)."""
    assert expert_gemm_rows(8, 2, 32, 1) == 64
    assert expert_gemm_rows(8, 2, 2.5, 1) == 5


def test_an_experts_gemm_computes_whole_row_tiles():
    """One expert taking every token: 9 rows are two tiles of 8 = 16 rows, 8 rows one tile. One token
    sent to 2 of 8 experts: each of the two computes a whole tile, 16 rows for 2 copies. A mean step
    of 8.5 tokens lies halfway between 8 tokens (8 rows) and 9 (16)."""
    assert expert_gemm_rows(1, 1, 9, 8) == pytest.approx(16)
    assert expert_gemm_rows(1, 1, 8, 8) == pytest.approx(8)
    assert expert_gemm_rows(8, 2, 1, 8) == pytest.approx(16)
    assert expert_gemm_rows(1, 1, 8.5, 8) == pytest.approx(12)


def test_serial_expert_gemms_each_take_the_longer_of_their_weights_and_their_padded_rows():
    """SMALL's expert: 3 x 1024 x 2048 = 6.29M parameters, 12.58 MB at 2 bytes: 629 us at 20 GB/s;
    one row tile of 8 is 2 x 6.29M x 8 = 100.7 MFLOP, 1.007 ms at 100 GFLOP/s. One token hits 2
    experts, each computing a whole tile: 2 x 1.007 ms, where the aggregate roofline would let
    them stream together (2 x 629 us) under FLOPs of 2 rows."""
    replica = _replica(SMALL)
    params = 3 * 1024 * 2048
    tile_s = 2 * params * 8 / 100e9
    assert serial_experts_s(CPU, SERIAL, replica, 1) == pytest.approx(2 * tile_s)
    one = step(CPU, SERIAL, replica, decode_seqs=1, context=0)
    assert one.experts_s == pytest.approx(4 * 2 * tile_s)  # four layers
    fused = step(CPU, EFF, replica, decode_seqs=1, context=0)
    assert fused.experts_s == 0.0
    assert one.total_s > fused.total_s


def test_a_sparse_layer_pays_the_engines_time_per_layer_and_per_expert_gemm():
    """4 layers x (0.2 ms routing + 2 experts touched x 0.1 ms) at one token = 1.6 ms more."""
    replica = _replica(SMALL)
    fitted = Efficiency(
        1.0, 1.0, 1.0, 0.0, 0.0, 0.0, "test", moe_layer_overhead_s=0.2e-3, expert_overhead_s=0.1e-3
    )
    bare = step(H200, EFF, replica, decode_seqs=1, context=0)
    paid = step(H200, fitted, replica, decode_seqs=1, context=0)
    assert paid.overhead_s - bare.overhead_s == pytest.approx(4 * (0.2e-3 + 2 * 0.1e-3))


def test_the_gpu_efficiency_runs_fused_experts_without_padding_or_fitted_moe_time():
    """The GPU roofline keeps its aggregate expert term: the sparse-layer terms are the CPU's."""
    from frontier.capacity.roofline import GPU_EFFICIENCY

    assert GPU_EFFICIENCY.expert_gemms == "fused" and GPU_EFFICIENCY.gemm_row_tile == 1
    assert GPU_EFFICIENCY.moe_layer_overhead_s == 0.0 and GPU_EFFICIENCY.expert_overhead_s == 0.0


def test_a_row_tile_below_one_is_refused_naming_it():
    with pytest.raises(FrontierError, match=r"efficiency.gemm_row_tile = 0: must be an integer >= 1"):
        Efficiency(1.0, 1.0, 1.0, 0.0, 0.0, 0.0, "test", gemm_row_tile=0)


def test_a_prefill_step_of_thousands_of_tokens_pads_its_expert_gemms_without_overflow():
    """8,192 tokens over 8 experts, top-2: ~2,048 rows each, at most one partly filled tile of 8 per
    expert, so the padded rows lie within 8 x 8 of the 16,384 routed copies."""
    rows = expert_gemm_rows(8, 2, 8192, 8)
    assert 16384 <= rows <= 16384 + 64
    assert serial_experts_s(CPU, SERIAL, _replica(SMALL), 8192) > 0
