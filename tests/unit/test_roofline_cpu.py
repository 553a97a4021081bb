"""The local stack's CPU as a roofline device: measured with real torch, cached, and calibrated to
the measured knee in stacks/baselines/local.json."""

from __future__ import annotations

import dataclasses
import json

import pytest

from frontier.capacity import cpu
from frontier.capacity.baseline import load_baseline
from frontier.capacity.devices import device_for
from frontier.capacity.replica import model_stack
from frontier.targets import load_stack


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """One state folder for the module: the measurement (15 s or so) is made once and cached there."""
    return tmp_path_factory.mktemp("state")


@pytest.fixture(autouse=True)
def _state_in_tmp(monkeypatch, state):
    monkeypatch.setattr(cpu, "state_dir", lambda: state)


def test_the_micro_benchmark_measures_bandwidth_and_flops_and_caches_them():
    cpu.cache_path(1).unlink(missing_ok=True)
    first, cached = cpu.measured_cpu(1)
    assert not cached
    # Any CPU that runs this moves more than 0.5 GB/s and multiplies faster than 1 GFLOP/s.
    assert first.bandwidth > 0.5e9 and first.flops > 1e9 and first.threads == 1
    assert json.loads(cpu.cache_path(1).read_text())["bandwidth"] == first.bandwidth
    again, cached = cpu.measured_cpu(1)
    assert cached and again == first


def test_the_cpu_is_measured_through_the_engines_own_gemm_with_the_overhead_fitted_on_the_engine():
    m, _ = cpu.measured_cpu(1)
    assert m.kernel in ("panel", "onednn", "torch")
    # The engine's own time: Python dispatching each layer's ops, scheduling and sampling each sequence.
    assert 0 < m.layer_overhead_s < 0.05 and 0 < m.seq_overhead_s < 0.05
    device, eff = device_for(local := load_stack("local"), local.only_pool)
    assert f"through the engine's {m.kernel} GEMM" in device.source
    assert (eff.layer_overhead_s, eff.seq_overhead_s) == (m.layer_overhead_s, m.seq_overhead_s)
    assert eff.gemm_weight_passes == 1.0  # packed once at load: one weight pass per step


def test_the_sparse_layer_overhead_is_fitted_on_the_engine_and_reaches_the_cpu_efficiency():
    m, _ = cpu.measured_cpu(1)
    assert m.gemm_row_tile == cpu.ROW_TILE.get(m.kernel, 1)
    # Routing a sparse layer and dispatching an expert's GEMM: microseconds to milliseconds, not seconds.
    assert 0 <= m.moe_layer_overhead_s < 0.05 and 0 <= m.expert_overhead_s < 0.05
    assert m.moe_layer_overhead_s + m.expert_overhead_s > 0
    _, eff = device_for(local := load_stack("local"), local.only_pool)
    assert (eff.gemm_row_tile, eff.moe_layer_overhead_s, eff.expert_overhead_s) == (
        m.gemm_row_tile,
        m.moe_layer_overhead_s,
        m.expert_overhead_s,
    )
    assert eff.expert_gemms == "serial"  # the CPU engine runs one GEMM per expert in use


def test_the_sparse_fit_checkpoint_is_a_mixtral_the_engine_routes(tmp_path):
    """The checkpoint the sparse fit runs: the tiny model's layers with a router and 8 experts each,
    loaded by the engine as a mixture of experts (greedy decoding runs through it)."""
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.models.llama.moe import SparseMoE
    from frontier_runtime.requests import SamplingParams

    model_dir = cpu.make_moe_checkpoint(tmp_path / "moe")
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["num_local_experts"], config["num_experts_per_tok"]) == (
        "mixtral",
        cpu.MOE_EXPERTS,
        cpu.MOE_TOP_K,
    )
    engine = LLMEngine(model_dir, max_batch_size=2, cpu_kv_cache_bytes=8 << 20, cpu_threads=1)
    try:
        sparse = [m for m in engine.runner.model.modules() if isinstance(m, SparseMoE)]
        assert len(sparse) == config["num_hidden_layers"]
        out = engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0))
        assert len(out[0]) == 4
    finally:
        engine.shutdown()


def test_a_cache_of_an_older_format_is_measured_again():
    first, _ = cpu.measured_cpu(1)
    document = json.loads(cpu.cache_path(1).read_text())
    document["format"] = cpu.FORMAT - 1
    cpu.cache_path(1).write_text(json.dumps(document))
    again, cached = cpu.measured_cpu(1, measure_now=_measured_again(first))
    assert not cached and again.measured_at == "again"


def test_a_damaged_cache_is_measured_again():
    cpu.cache_path(1).parent.mkdir(parents=True, exist_ok=True)
    cpu.cache_path(1).write_text("{not json")
    first = dataclasses.replace(cpu.CpuMeasurement(1, 1e9, 1e9, "", "", ""), measured_at="first")
    result, cached = cpu.measured_cpu(1, measure_now=_measured_again(first))
    assert not cached and result.measured_at == "again"


def _measured_again(previous: cpu.CpuMeasurement):
    """What the cache policy is tested with: a measurement made now, told apart by its time stamp
    (the real one takes 15 s and is tested above)."""
    return lambda threads: dataclasses.replace(previous, threads=threads, measured_at="again")


def test_the_local_stack_is_modelled_on_its_measured_cpu_and_calibrated_to_its_knee():
    local = load_stack("local")
    device, _ = device_for(local, local.only_pool)
    assert device.name == "CPU, 1 thread(s)"  # runtime.cpu_threads = 1
    assert device.source.startswith("measured on this machine")
    baseline = load_baseline("local")
    model = model_stack(local, local.only_pool, baseline)
    assert model.calibration is not None and model.calibration.fitted
    assert model.fit.best is not None
    assert model.fit.best.requests_per_s == pytest.approx(baseline.replica_qps, rel=0.01)
    assert model.efficiency.source.startswith("calibrated")
