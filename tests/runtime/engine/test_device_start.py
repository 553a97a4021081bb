"""A CUDA start's sequence (KV sizing from measured memory, then decode-graph capture and replay),
run on CPU through injected device operations that stand in for the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_fixtures import needs_native_kernels
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.model_runner import DeviceOps, ModelRunner, StepInput
from frontier_runtime.ops import cpu_kernel

# A model built and stepped per test (1-2 s each): out of the quick tier.
pytestmark = pytest.mark.slow

GIB = 1 << 30


class FakeGpu(DeviceOps):
    """Reports fixed memory figures and records every call; captures by recording the eager step."""

    sizes_kv_by_memory = True

    def __init__(self, free: int, total: int, peak: int = 0, captures_graphs: bool = False) -> None:
        self.free, self.total, self.peak = free, total, peak
        self.captures_graphs = captures_graphs
        self.calls: list[str] = []

    def synchronize(self, device: torch.device) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.calls.append("reset_peak_memory_stats")

    def max_memory_allocated(self, device: torch.device) -> int:
        self.calls.append("max_memory_allocated")
        return self.peak

    def memory_reserved(self, device: torch.device) -> int:
        self.calls.append("memory_reserved")
        return 0

    def mem_get_info(self, device: torch.device) -> tuple[int, int]:
        self.calls.append("mem_get_info")
        return self.free, self.total

    def capture(self, forward, pool):  # noqa: ANN001, ANN201
        self.calls.append("capture")
        return super().capture(forward, pool)


def config(model_dir: Path, **overrides: object) -> EngineConfig:
    return EngineConfig(model_dir, device="cpu", max_batch_size=4, max_seq_len=128, **overrides)


@pytest.fixture(params=[pytest.param("cpu-kernel", marks=needs_native_kernels), "triton"])
def capturable_backend(request: pytest.FixtureRequest) -> str:
    """Backends whose metadata is tensors only: the native CPU kernel, and the Triton kernel a GPU
    runs (here under Triton's interpreter)."""
    if request.param == "cpu-kernel":
        assert cpu_kernel.load(), "the native attention kernel did not load"
    return str(request.param)


def test_a_cuda_start_sizes_the_kv_cache_before_it_captures_graphs(
    tied_dir: Path, capturable_backend: str
) -> None:
    gpu = FakeGpu(free=2 * GIB, total=2 * GIB, captures_graphs=True)
    runner = ModelRunner(config(tied_dir, attention_backend=capturable_backend), ops=gpu)
    assert gpu.calls.index("mem_get_info") < gpu.calls.index("capture")
    assert gpu.calls.count("capture") == len(runner.graph_sizes())
    assert sorted(runner.graphs) == runner.graph_sizes()
    assert runner.kv_caches[0][0].shape[0] == runner.num_blocks + 1


@pytest.mark.parametrize(("free_gib", "utilization"), [(2, 0.9), (2, 0.5), (1.5, 0.9)])
def test_the_kv_block_count_is_the_share_of_gpu_memory_left_after_weights_the_worst_step_and_others(
    tied_dir: Path, free_gib: float, utilization: float
) -> None:
    """``gpu_memory_utilization`` of the device's total, less the worst step's peak and memory held
    by others (total - free), less one scratch block."""
    peak = 50 << 20
    gpu = FakeGpu(free=int(free_gib * GIB), total=2 * GIB, peak=peak)
    runner = ModelRunner(config(tied_dir, gpu_memory_utilization=utilization), ops=gpu)
    probe = runner.max_blocks_per_seq * runner.bytes_per_block  # the worst step's own small cache
    budget = int(2 * GIB * utilization) - (peak - probe) - (2 * GIB - int(free_gib * GIB))
    assert runner.num_blocks == budget // runner.bytes_per_block - 1


def test_a_start_with_too_little_free_memory_gets_no_kv_blocks_rather_than_a_negative_count(
    tied_dir: Path,
) -> None:
    gpu = FakeGpu(free=GIB // 10, total=2 * GIB)
    assert ModelRunner(config(tied_dir, gpu_memory_utilization=0.5), ops=gpu).num_blocks == 0


def prefill_then_decode() -> tuple[StepInput, StepInput]:
    a, b = list(range(10, 15)), list(range(20, 29))
    prefill = StepInput(
        input_ids=a + b,
        rows=[0, 1],
        computed=[0, 0],
        counts=[len(a), len(b)],
        table_updates=[0, 0, 0, 1, 0, 1],
        logits_indices=[len(a) - 1, len(a) + len(b) - 1],
    )
    decode = StepInput(
        input_ids=[7, 8],
        rows=[0, 1],
        computed=[len(a), len(b)],
        counts=[1, 1],
        num_decodes=2,
        logits_indices=[0, 1],
    )
    return prefill, decode


def test_a_decode_step_replayed_from_a_captured_graph_equals_the_eager_step(
    tied_dir: Path, capturable_backend: str
) -> None:
    cfg = config(tied_dir, attention_backend=capturable_backend, num_blocks=16)
    gpu = FakeGpu(free=2 * GIB, total=2 * GIB, captures_graphs=True)
    graphed, eager = ModelRunner(cfg, ops=gpu), ModelRunner(cfg)
    assert graphed.graphs and not eager.graphs
    replays = []
    for size, graph in graphed.graphs.items():
        run = graph.run
        graph.run = lambda run=run, size=size: (replays.append(size), run())  # type: ignore[method-assign]
    prefill, decode = prefill_then_decode()
    for step in (prefill, decode):
        torch.testing.assert_close(graphed.execute(step), eager.execute(step))
    assert replays == [2]
