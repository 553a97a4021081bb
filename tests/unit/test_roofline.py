"""The roofline of one replica against decode steps worked out by hand.

The efficiencies are pinned here (not the module's defaults) so the arithmetic in the comments stays
checkable whatever the defaults become.
"""

from __future__ import annotations

import dataclasses

import pytest

from frontier.capacity.baseline import Baseline
from frontier.capacity.calibrate import calibrate, knee_qps
from frontier.capacity.devices import device_for, gpu_device
from frontier.capacity.gpus import GPUS, INSTANCES, gpu_spec
from frontier.capacity.roofline import (
    Device,
    Efficiency,
    Replica,
    Shape,
    decode_tokens_per_s,
    fit_slo,
    operating_point,
    step,
)
from frontier.errors import FrontierError
from frontier.targets import load_stack

EFF = Efficiency(
    bandwidth=0.8,
    flops=0.6,
    link=0.7,
    allreduce_latency_s=10e-6,
    step_overhead_s=2e-3,
    seq_overhead_s=10e-6,
    source="test",
)
MS = 1e-3
US = 1e-6


@pytest.fixture(scope="module")
def prod():
    return load_stack("prod")


@pytest.fixture(scope="module")
def h100():
    return gpu_device(gpu_spec("H100-SXM-80GB"), "bfloat16")


@pytest.fixture(scope="module")
def llama70b_tp8(prod):
    return Replica.from_pool(prod.only_pool)


# Llama-3.1-70B: 80 layers, hidden 8192, 64 heads of 128, 8 KV heads, MLP 28672, vocab 128256.
# Matmul weights per layer: q, o 2 x 8192^2 = 134,217,728; k, v 2 x 8192 x 1024 = 16,777,216;
# gate, up, down 3 x 8192 x 28672 = 704,643,072; sum 855,638,016. x 80 = 68,451,041,280,
# + LM head 128256 x 8192 = 1,050,673,152 -> 69,501,714,432 (norms and the embedding lookup excluded).
LLAMA_70B_MATMUL = 69_501_714_432


def test_matmul_parameters_of_a_70b_llama(prod):
    shape = Shape.from_model(prod.model)
    assert shape.layer_matmul_parameters == 855_638_016
    assert shape.matmul_parameters == LLAMA_70B_MATMUL


def test_70b_tp8_h100_decode_step_at_batch_1(h100, llama70b_tp8):
    s = step(h100, EFF, llama70b_tp8, decode_seqs=1, context=2048)
    # weights per GPU: 69,501,714,432 x 2 B / 8 = 17,375,428,608 B
    assert s.weight_bytes == 17_375_428_608
    # KV read: 1 sequence x 2048 tokens x 40,960 B/token/GPU = 83,886,080 B
    assert s.kv_bytes == 83_886_080
    # memory: 17,459,314,688 B / (3,350 GB/s x 0.8 = 2,680 GB/s) = 6.5147 ms
    assert s.memory_s == pytest.approx(17_459_314_688 / 2.68e12)
    assert s.memory_s == pytest.approx(6.5147 * MS, rel=1e-4)
    # FLOPs: 2 x 69.5e9 / 8 = 17,375,428,608 + attention 4 x 80 x 8192 x 2048 / 8 = 671,088,640
    assert s.flops == 18_046_517_248
    # compute: / (989.5 TF x 0.6 = 593.7 TF) = 30.4 us: decode at batch 1 is bound by bandwidth
    assert s.compute_s == pytest.approx(30.40 * US, rel=1e-3)
    assert s.bound == "memory"
    # 2 all-reduces x 80 layers of 1 x 8192 x 2 B = 16,384 B: 2 x 7/8 x 16,384 / (450 GB/s x 0.7) = 0.091 us
    # + 10 us latency each = 10.091 us; x 160 = 1.6146 ms
    assert s.comm_s == pytest.approx(160 * (28_672 / 315e9 + 10e-6))
    assert s.comm_s == pytest.approx(1.6146 * MS, rel=1e-4)
    # overhead: 2 ms per step + 10 us for one sequence
    assert s.overhead_s == pytest.approx(2.01 * MS)
    # 6.5147 + 1.6146 + 2.01 = 10.139 ms per token: 98.6 tokens/s
    assert s.total_s == pytest.approx(10.139 * MS, rel=1e-4)
    assert decode_tokens_per_s(h100, EFF, llama70b_tp8, 1, 2048) == pytest.approx(98.63, rel=1e-3)


def test_70b_tp8_h100_decode_step_at_batch_64(h100, llama70b_tp8):
    s = step(h100, EFF, llama70b_tp8, decode_seqs=64, context=2048)
    # KV read: 64 x 2048 x 40,960 = 5,368,709,120 B; with the weights 22,744,137,728 B / 2.68 TB/s = 8.4866 ms
    assert s.kv_bytes == 5_368_709_120
    assert s.memory_s == pytest.approx(8.4866 * MS, rel=1e-4)
    # FLOPs: 64 x 18,046,517,248 = 1,154,977,103,872 / 593.7 TF = 1.9454 ms: still bound by bandwidth
    assert s.flops == 64 * 18_046_517_248
    assert s.compute_s == pytest.approx(1.9454 * MS, rel=1e-4)
    assert s.bound == "memory"
    # all-reduce of 64 x 16,384 = 1,048,576 B: 1.75 x 1,048,576 / 315 GB/s = 5.825 us + 10 us; x 160 = 2.532 ms
    assert s.comm_s == pytest.approx(2.532 * MS, rel=1e-3)
    # overhead 2 ms + 64 x 10 us = 2.64 ms; total 8.4866 + 2.532 + 2.64 = 13.659 ms: 4,686 tokens/s
    assert s.overhead_s == pytest.approx(2.64 * MS)
    assert s.total_s == pytest.approx(13.659 * MS, rel=1e-3)
    assert decode_tokens_per_s(h100, EFF, llama70b_tp8, 64, 2048) == pytest.approx(4686, rel=1e-3)


def test_a_long_prefill_is_bound_by_flops(h100, llama70b_tp8):
    s = step(h100, EFF, llama70b_tp8, decode_seqs=0, context=0, prefill_tokens=8192, prefill_attended=4096)
    # 2 x 69.5e9 x 8192 / 8 = 142.3 TFLOP + attention 4 x 80 x 8192 x 8192 x 4096 / 8 = 11.0 TFLOP
    assert s.flops == 2 * LLAMA_70B_MATMUL * 8192 // 8 + 4 * 80 * 8192 * 8192 * 4096 // 8
    assert s.compute_s == pytest.approx(s.flops / 593.7e12)  # ~258 ms
    assert s.bound == "compute" and s.compute_s > 30 * s.memory_s


def test_one_gpu_has_no_all_reduce(prod, h100):
    single = dataclasses.replace(Replica.from_pool(prod.only_pool), tensor_parallel=1)
    s = step(h100, EFF, single, decode_seqs=1, context=0)
    assert s.comm_s == 0
    assert s.weight_bytes == LLAMA_70B_MATMUL * 2  # the whole model on one GPU


def test_concurrency_beyond_the_batch_only_queues(h100, llama70b_tp8):
    at_batch = operating_point(h100, EFF, llama70b_tp8, 1500, 350, 128)
    beyond = operating_point(h100, EFF, llama70b_tp8, 1500, 350, 256)
    assert at_batch.batch == beyond.batch == 128
    assert beyond.output_tokens_per_s == pytest.approx(at_batch.output_tokens_per_s)
    assert beyond.tpot_s == pytest.approx(at_batch.tpot_s)
    # Little's law: 256 in flight at X req/s spend 256 / X each; the engine holds one for 128 / X.
    assert beyond.queue_wait_s == pytest.approx(128 / beyond.requests_per_s)
    assert beyond.ttft_s == pytest.approx(at_batch.ttft_s + beyond.queue_wait_s)


def test_throughput_is_the_batch_over_its_time_in_the_engine(h100, llama70b_tp8):
    p = operating_point(h100, EFF, llama70b_tp8, 1500, 350, 32)
    assert p.queue_wait_s == pytest.approx(0, abs=1e-12)
    assert p.e2e_s == pytest.approx(p.ttft_s + 349 * p.tpot_s)
    assert p.requests_per_s == pytest.approx(32 / p.e2e_s)
    assert p.output_tokens_per_s == pytest.approx(350 * p.requests_per_s)


def test_the_token_budget_stretches_a_request_over_more_steps(h100, llama70b_tp8):
    # 64 sequences x (1500 + 350) tokens = 118,400 tokens per cycle; a budget of 256 tokens a step
    # needs 462.5 steps, more than the 350 output tokens: TPOT = mean step x 462.5 / 350.
    tight = dataclasses.replace(llama70b_tp8, max_num_batched_tokens=256)
    p = operating_point(h100, EFF, tight, 1500, 350, 64)
    assert p.budget_bound
    assert p.tpot_s == pytest.approx(p.mean_step.total_s * 462.5 / 350)
    assert p.mean_step.tokens == pytest.approx(256)  # the budget, full
    roomy = operating_point(h100, EFF, llama70b_tp8, 1500, 350, 64)
    assert not roomy.budget_bound and roomy.tpot_s < p.tpot_s


def test_the_best_point_is_the_largest_concurrency_meeting_every_slo(prod, h100, llama70b_tp8):
    fit = fit_slo(h100, EFF, llama70b_tp8, prod.slo, 1500, 350)
    best = fit.best
    assert best is not None and fit.broken_at_1 == ()
    assert best.ttft_s * 1000 <= prod.slo.ttft_ms and best.tpot_s * 1000 <= prod.slo.tpot_ms
    after = fit.curve[best.concurrency]  # concurrency best + 1
    assert after.ttft_s * 1000 > prod.slo.ttft_ms  # one more request queues past the TTFT target


def test_an_slo_no_concurrency_meets_names_the_field(prod, h100, llama70b_tp8):
    strict = prod.slo.model_copy(update={"tpot_ms": 5})
    fit = fit_slo(h100, EFF, llama70b_tp8, strict, 1500, 350)
    assert fit.best is None
    assert len(fit.broken_at_1) == 1 and fit.broken_at_1[0].startswith("slo.tpot_ms (10.")


def test_every_gpu_has_a_datasheet_and_every_instance_a_known_gpu_and_price_source():
    for name in (
        "A10G-24GB",
        "L4-24GB",
        "L40S-48GB",
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "H100-SXM-80GB",
        "H200-SXM-141GB",
    ):
        assert GPUS[name].source and GPUS[name].bandwidth > 0 and GPUS[name].link_bandwidth > 0
    for inst in INSTANCES.values():
        assert inst.gpu in GPUS and inst.price_source and inst.price_per_hour > 0


def test_the_stacks_gpus_are_in_the_table():
    for stack in ("dev", "staging", "prod"):
        assert load_stack(stack).serving_group.gpu_type in GPUS


def test_fp8_runs_at_the_fp8_rate_only_where_the_gpu_has_it():
    assert GPUS["H100-SXM-80GB"].flops_for(1) == 1979e12
    assert GPUS["A100-SXM4-80GB"].flops_for(1) == 312e12  # no fp8 tensor cores: the bf16 rate
    assert GPUS["A100-SXM4-80GB"].flops_for(4) == 156e12  # float32 as TF32


def test_an_unknown_gpu_type_names_the_field_and_the_known_types(prod):
    group = prod.serving_group.model_copy(update={"gpu_type": "B200-192GB"})
    odd = prod.model_copy(update={"node_groups": (group,)})
    with pytest.raises(FrontierError) as err:
        device_for(odd, odd.only_pool)
    message = str(err.value)
    assert "node_groups[0].gpu_type = 'B200-192GB': unknown GPU type" in message
    assert (
        "known types: A100-SXM4-40GB, A100-SXM4-80GB, A10G-24GB, H100-SXM-80GB, H200-SXM-141GB, L4-24GB, L40S-48GB"
        in message
    )


def test_bad_efficiency_names_the_field():
    with pytest.raises(FrontierError, match=r"efficiency.bandwidth = 1.5: must lie in \(0, 1\]"):
        dataclasses.replace(EFF, bandwidth=1.5)


def _baseline(qps: float) -> Baseline:
    return Baseline(
        stack="prod",
        measured_at="2026-11-30T10:00:00Z",
        replica_qps=qps,
        output_tokens_per_s=qps * 350,
        p50_latency_ms=900.0,
        p99_latency_ms=4000.0,
        ttft_p99_ms=700.0,
        hosts_measured=1,
        release_id="r-abc123",
    )


def test_calibration_fits_the_engine_overhead_to_the_measured_knee(prod, h100, llama70b_tp8):
    modelled = knee_qps(h100, EFF, llama70b_tp8, prod.slo, 1500, 350)
    fitted, cal = calibrate(h100, EFF, llama70b_tp8, prod.slo, 1500, 350, _baseline(8.0))
    assert cal.fitted and cal.modelled_qps == pytest.approx(modelled)
    assert cal.calibrated_qps == pytest.approx(8.0, rel=0.01)
    assert cal.overhead_scale > 1  # slower than modelled: more engine time per step
    assert fitted.step_overhead_s == pytest.approx(EFF.step_overhead_s * cal.overhead_scale)
    assert fitted.bandwidth == EFF.bandwidth and fitted.source.startswith("calibrated")


def test_calibration_refuses_a_knee_beyond_the_roofline(prod, h100, llama70b_tp8):
    fitted, cal = calibrate(h100, EFF, llama70b_tp8, prod.slo, 1500, 350, _baseline(500.0))
    assert not cal.fitted and fitted == EFF
    assert "not fitted: the measured knee (500 req/s) beats the roofline" in cal.note


CPU_EFF = Efficiency(
    bandwidth=1.0,
    flops=1.0,
    link=1.0,
    allreduce_latency_s=0.0,
    step_overhead_s=2.5e-3,
    seq_overhead_s=0.3e-3,
    source="test",
    overlap=0.0,
    gemm_weight_passes=3.0,
)
CPU = Device("CPU", 2e9, bandwidth=10e9, flops=50e9, link_bandwidth=10e9, source="test")


def test_tiny_model_on_a_cpu_without_overlap_and_with_packed_gemm_weights():
    tiny = Replica.from_pool(load_stack("local").only_pool)
    # 4 layers x (2 x 256^2 + 2 x 256 x 128 + 3 x 256 x 688 = 724,992) + LM head 4096 x 256 = 3,948,544
    assert tiny.shape.matmul_parameters == 3_948_544
    assert tiny.kv_bytes_per_token_per_gpu == 2 * 4 * 4 * 32 * 4 == 4096  # float32 KV
    # Batch 8, context 64: the GEMM packs the weights, so 3 x 15,794,176 B cross memory, + KV
    # 8 x 64 x 4096 = 2,097,152 B: 49,479,680 B / 10 GB/s = 4.948 ms
    s = step(CPU, CPU_EFF, tiny, decode_seqs=8, context=64)
    assert s.memory_s == pytest.approx(49_479_680 / 10e9)
    # FLOPs 2 x 3,948,544 x 8 + 4 x 4 x 256 x 8 x 64 = 65,273,856 / 50 GFLOP/s = 1.305 ms
    assert s.compute_s == pytest.approx(65_273_856 / 50e9)
    # no overlap: 4.948 + 1.305 + overhead 2.5 + 8 x 0.3 = 11.153 ms
    assert s.total_s == pytest.approx(11.1535 * MS, rel=1e-4)
    # Batch 1 is a GEMV: the weights once, 15,794,176 + 64 x 4096 = 16,056,320 B = 1.606 ms;
    # FLOPs 7,897,088 + 262,144 = 8,159,232 = 0.163 ms; + 2.5 + 0.3 ms = 4.569 ms
    one = step(CPU, CPU_EFF, tiny, decode_seqs=1, context=64)
    assert one.memory_s == pytest.approx(16_056_320 / 10e9)
    assert one.total_s == pytest.approx(4.5688 * MS, rel=1e-4)


def test_the_engine_overhead_has_a_part_per_layer(h100, llama70b_tp8):
    # 2 ms per step + 80 layers x 0.1 ms + 1 sequence x 10 us = 10.01 ms
    per_layer = dataclasses.replace(EFF, layer_overhead_s=0.1e-3)
    s = step(h100, per_layer, llama70b_tp8, decode_seqs=1, context=2048)
    assert s.overhead_s == pytest.approx(10.01 * MS)
    scaled = per_layer.with_overhead_scale(2.0, "test")
    assert scaled.layer_overhead_s == pytest.approx(0.2e-3) and scaled.step_overhead_s == pytest.approx(4e-3)


def test_a_server_sharing_the_engines_cores_adds_its_time_per_streamed_token_and_per_new_request(
    h100, llama70b_tp8
):
    # 64 sequences each streaming a token, and 2 new requests whose prompts the step starts: the
    # server's 0.5 ms per token and 2 ms per request add 64 x 0.5 + 2 x 2 = 36 ms to the step.
    served = dataclasses.replace(EFF, token_overhead_s=0.5 * MS, request_overhead_s=2 * MS)
    kwargs = {"decode_seqs": 64, "context": 1024, "prefill_tokens": 512, "prefill_attended": 256}
    alone = step(h100, EFF, llama70b_tp8, **kwargs)
    shared = step(h100, served, llama70b_tp8, new_requests=2, **kwargs)
    assert shared.overhead_s - alone.overhead_s == pytest.approx(36 * MS)
    # A replica whose server runs elsewhere (a GPU host's other cores) pays none of it.
    assert step(h100, EFF, llama70b_tp8, new_requests=2, **kwargs).overhead_s == alone.overhead_s


def test_calibration_scales_the_servers_time_with_the_engines():
    served = dataclasses.replace(EFF, token_overhead_s=0.5 * MS, request_overhead_s=2 * MS)
    scaled = served.with_overhead_scale(2.0, "calibrated")
    assert (scaled.token_overhead_s, scaled.request_overhead_s) == (1 * MS, 4 * MS)
