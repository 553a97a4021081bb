"""Any stack the loader accepts renders a runtime.yaml the runtime accepts (the two models agree)."""

from __future__ import annotations

from frontier_runtime.config import parse_config
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from frontier.config.checks import cross_check
from frontier.config.schema import Settings
from frontier.render.host import render_runtime_config
from frontier.targets import load_stack

BASE = {name: load_stack(name).model_dump() for name in ("local", "prod")}


@st.composite
def runtime_settings(draw):
    """Batching and queueing values that satisfy the loader's ordering rules by construction."""
    max_batch_size = draw(st.integers(1, 64))
    max_concurrency = max_batch_size + draw(st.integers(0, 512))
    return {
        "port": draw(st.integers(1024, 65535)),
        "max_concurrency": max_concurrency,
        "queue": {
            "max_length": max_concurrency + draw(st.integers(0, 4096)),
            "timeout_ms": draw(st.integers(1, 3_600_000)),
        },
        "batch": {
            "window_ms": draw(st.floats(0, 1000, allow_nan=False)),
            "max_batch_size": max_batch_size,
            "max_num_batched_tokens": draw(st.integers(max(16, max_batch_size), 65536)),
            "chunked_prefill": True,
        },
        "kv_cache_dtype": draw(st.sampled_from(["auto", "float32", "bfloat16", "float16", "fp8"])),
        "gpu_memory_utilization": draw(st.floats(0.5, 0.98, allow_nan=False)),
        "block_size": draw(st.sampled_from([1, 8, 16, 32, 256])),
        "drain_timeout_s": draw(st.floats(0, 3600, allow_nan=False)),
    }


@settings(max_examples=40, deadline=None)
@given(stack=st.sampled_from(sorted(BASE)), changes=runtime_settings(), max_seq_len=st.integers(16, 4096))
def test_every_valid_stack_renders_a_config_the_runtime_accepts(stack, changes, max_seq_len):
    raw = dict(BASE[stack])
    (pool,) = raw["pools"]
    pool = {
        **pool,
        "runtime": {**pool["runtime"], **changes},
        "model": {**pool["model"], "max_seq_len": max_seq_len},
    }
    candidate = Settings.model_validate({**raw, "pools": [pool]})
    assume(not list(cross_check(candidate)))  # e.g. a KV cache that does not fit memory
    config = parse_config(render_runtime_config(candidate, candidate.only_pool))
    assert config.batch.max_batch_size == changes["batch"]["max_batch_size"]
    assert config.batch.window_ms == changes["batch"]["window_ms"]
    assert config.gpu_memory_utilization == changes["gpu_memory_utilization"]
    assert config.drain_timeout_s == changes["drain_timeout_s"]
