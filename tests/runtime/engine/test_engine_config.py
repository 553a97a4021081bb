"""The engine built from the rendered runtime.yaml (``RuntimeConfig``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from frontier_runtime.config import parse_config
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.engine.loop import AsyncEngine
from frontier_runtime.requests import SamplingParams

YAML = """
model: {{name: tiny, weights_uri: {src}, dtype: float32, max_seq_len: {max_seq_len}}}
max_concurrency: 8
queue: {{max_length: 16, timeout_ms: 1000}}
batch: {{window_ms: 5, max_batch_size: 4, max_num_batched_tokens: 64}}
block_size: 8
cpu_kv_cache_bytes: {kv_bytes}
prefix_caching: false
tensor_parallel_size: 1
pipeline_parallel_size: {pp}
device: cpu
seed: 3
"""


def _config(src: Path, max_seq_len: int = 256, kv_bytes: int = 1 << 20, pp: int = 1):  # noqa: ANN202
    return parse_config(YAML.format(src=src, max_seq_len=max_seq_len, kv_bytes=kv_bytes, pp=pp))


def test_the_engine_takes_its_limits_and_kv_budget_from_the_config(tied_dir: Path) -> None:
    engine = LLMEngine.from_config(_config(tied_dir), tied_dir)
    # tied model: 2 layers x 2 KV heads x 32 dims x 4 bytes x K and V = 1 KiB per token, 8 KiB per block
    assert engine.block_manager.num_blocks == (1 << 20) // (8 * 1024)
    assert engine.block_manager.block_size == 8 and not engine.block_manager.enable_prefix_caching
    assert engine.max_seq_len == 256
    assert engine.scheduler.max_batch_size == 4 and engine.scheduler.max_num_batched_tokens == 64
    for i in range(6):
        engine.add_request(str(i), [1, 2, 3, 4, 5], SamplingParams(max_tokens=3, temperature=0.0))
    engine.step()
    assert engine.stats().last_batch_size == 4


def test_a_kv_budget_too_small_for_max_seq_len_is_refused_naming_the_settings(tied_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"model.max_seq_len 512 .* raise cpu_kv_cache_bytes"):
        LLMEngine.from_config(_config(tied_dir, max_seq_len=512, kv_bytes=64 * 1024), tied_dir)


def test_the_async_engine_takes_the_batch_window_from_the_config(tied_dir: Path) -> None:
    engine = AsyncEngine.from_config(_config(tied_dir), tied_dir)
    try:
        assert engine.batch_window_s == pytest.approx(0.005)
        assert engine.max_seq_len == 256
    finally:
        engine.shutdown()


def test_the_engine_config_carries_every_setting_from_the_runtime_config(tied_dir: Path) -> None:
    runtime = _config(tied_dir).model_copy(update={"cpu_threads": 6, "cpu_bind_threads": True})
    config = EngineConfig.from_runtime(runtime, tied_dir)
    assert config == EngineConfig(
        model_dir=tied_dir,
        dtype="float32",
        device="cpu",
        max_seq_len=256,
        max_batch_size=4,
        max_num_batched_tokens=64,
        window_ms=5,
        block_size=8,
        cpu_kv_cache_bytes=1 << 20,
        prefix_caching=False,
        cpu_threads=6,
        cpu_bind_threads=True,
        seed=3,
    )
    assert config.updated(tensor_parallel_size=4).threads_per_rank == 1
    assert config.updated(tensor_parallel_size=2).threads_per_rank == 3


def test_engine_settings_are_checked_when_the_config_is_built(tied_dir: Path) -> None:
    with pytest.raises(
        ValueError, match=r"dtype\n  Input should be 'float32', 'bfloat16', 'float16' or 'auto'"
    ):
        EngineConfig(tied_dir, dtype="int8")
    with pytest.raises(ValueError, match=r"kv_cache_dtype\n  Input should be .*'fp8'"):
        EngineConfig(tied_dir, kv_cache_dtype="int4")
    with pytest.raises(ValueError, match=r"attention_backend\n  Input should be 'auto', 'cpu-kernel'"):
        EngineConfig(tied_dir, attention_backend="flex")
    with pytest.raises(ValueError, match=r"max_batch\n  Extra inputs are not permitted"):
        LLMEngine(tied_dir, max_batch=4)
