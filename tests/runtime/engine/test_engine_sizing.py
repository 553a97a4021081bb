"""The memory profile's worst step, run on CPU through the same code path CUDA sizing uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from frontier_runtime.engine.llm_engine import LLMEngine


def test_the_worst_step_fills_the_batch_and_the_token_budget_at_full_context(tied_dir: Path) -> None:
    engine = LLMEngine(tied_dir, max_batch_size=8, max_num_batched_tokens=64, max_seq_len=128, num_blocks=64)
    runner = engine.runner
    step = runner.worst_step()
    assert len(step.rows) == 8 and sum(step.counts) == 64
    assert step.num_decodes == 7 and step.counts[-1] == 57
    assert all(c + n == 128 for c, n in zip(step.computed, step.counts, strict=True))
    assert len(step.logits_indices) == 8
    runner.profile_worst_step()  # what _device_blocks measures; it must leave the real cache alone
    assert runner.kv_caches[0][0].shape[0] == runner.num_blocks + 1
    assert int(runner.tables.abs().sum()) == 0


def test_the_worst_step_with_a_budget_below_the_batch_is_all_decodes_and_one_chunk(tied_dir: Path) -> None:
    engine = LLMEngine(tied_dir, max_batch_size=16, max_num_batched_tokens=16, max_seq_len=64, num_blocks=32)
    step = engine.runner.worst_step()
    assert sum(step.counts) == 16 and len(step.rows) == 16 and step.counts[-1] == 1


BLOCKED = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"fastapi", "starlette", "uvicorn", "boto3", "botocore", "frontier"}:
            raise ImportError(f"{name} is not on the GPU check machine")
sys.meta_path.insert(0, Block())
from frontier_runtime.requests import SamplingParams
from frontier_runtime.engine.llm_engine import LLMEngine
engine = LLMEngine(sys.argv[1], max_batch_size=2, num_blocks=16, max_seq_len=64)
print(engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)))
"""


def test_the_engine_runs_without_the_server_or_boto3(tied_dir: Path) -> None:
    """bench/gpu_check.py runs where only torch, transformers (with PyYAML), safetensors, tokenizers
    and the wheels bench/gpu_check.sh carries exist, from runtime/ and hostside/ on the path."""
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(tied_dir)],
        env={
            "PYTHONPATH": f"{root / 'runtime'}:{root / 'hostside'}",
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(eval(out.stdout.strip().splitlines()[-1])[0]) == 3
