"""bench/gpu_check.py rehearsed on CPU (``--smoke``): the phases a GPU lease runs, in order, each
leaving its JSON before the next starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["env", "start", "logits", "graphs", "throughput", "vllm"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHONPATH": "runtime:hostside", "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--out-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, out


@pytest.mark.slow
def test_the_smoke_run_passes_every_phase(smoke_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and list(summary["phases"]) == PHASES


@pytest.mark.slow
def test_each_phase_writes_its_own_json_file(
    smoke_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = smoke_run
    names = sorted(p.name for p in out.glob("phase*.json"))
    assert names == [f"phase{i}_{name}.json" for i, name in enumerate(PHASES)]
    for i, name in enumerate(PHASES):
        row = json.loads((out / f"phase{i}_{name}.json").read_text())
        assert (row["phase"], row["name"], row["ok"]) == (i, name, True), row.get("error")
        assert row["seconds"] <= row["limit_s"]


@pytest.mark.slow
def test_the_logits_phase_scores_the_engine_and_transformers_bf16_against_float32(
    smoke_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = smoke_run
    row = json.loads((out / "phase2_logits.json").read_text())
    for run in ("engine", "transformers_bf16"):
        scored = row[run]
        assert scored["positions"] == row["prompts"] * row["new_tokens"] > 0
        assert scored["argmax_equal"] + scored["near_ties"] + scored["beyond_margin"] == scored["positions"]


@pytest.mark.slow
def test_the_env_phase_reports_each_backends_block_sizes(
    smoke_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = smoke_run
    row = json.loads((out / "phase0_env.json").read_text())
    assert row["block_sizes"]["flash-varlen"]["16"] == "it needs a GPU"
    assert row["block_sizes"]["triton"]["16"] == "ok"  # under the interpreter
    assert row["block_sizes"]["sdpa-gather"]["256"] == "ok"


@pytest.mark.slow
def test_the_step_breakdown_times_the_forward_the_engine_runs(
    smoke_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = smoke_run
    row = json.loads((out / "phase3_graphs.json").read_text())
    for streams, split in row["breakdown"].items():
        # The hook sits on what the step calls: the model's share is measured, not 0.
        assert split["model_ms"] > 0, (streams, split)
        assert split["model_ms"] + split["rest_ms"] == pytest.approx(split["step_ms"], abs=0.01)
