"""A load test against a real runtime process on this CPU host: the report reads the runtime's own
CPU seconds off its /metrics, says "no GPU" rather than 0, splits the requests by prompt length at
the stack's edges, and the baseline saved from it carries all of it; a concurrency sweep prints its
knee as the pool's scaling target."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit
from rich.console import Console

from frontier import project
from frontier.capacity.baseline import load_baseline
from frontier.cli.common import settings_for
from frontier.cli.local import loadtest, save_knee_baseline
from frontier.loadtest.client import Target
from frontier.loadtest.report import LoadShape, ServedStep, length_table, measure, steps_table
from frontier.loadtest.stats import SloTargets, StepSummary, find_knee
from tests.gateway.harness import start_runtime, wait_ready
from tests.verify.harness import SHAPE

MODEL = "tiny-llama"  # the local stack's pool, so `fab loadtest -s local --url` asks for it

SLO = SloTargets(ttft_ms=60_000, tpot_ms=60_000, p99_latency_ms=120_000, error_rate=0.01)
EDGES = (64, 256)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from frontier_runtime.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("loadtest-runtime")
    process = start_runtime(MODEL, make_tiny_checkpoint(root / MODEL, seed=3, **SHAPE), root / "work")
    try:
        wait_ready([process])
        yield process.url
    finally:
        process.kill()


@pytest.fixture(scope="module")
def measured(runtime: str) -> list[StepSummary]:
    """Two rates, each request's prompt drawn from three lengths on both sides of the edges."""
    target = Target(base_url=runtime, model=MODEL, prompt_mix=(16, 120, 300), max_tokens=4)
    shape = LoadShape(rates=(2.0, 3.0), seconds=3.0)
    return measure(target, shape, SLO, Console(width=200, quiet=True), length_edges=EDGES)


def test_the_runtimes_own_cpu_seconds_give_each_steps_cpu_use(measured: list[StepSummary]) -> None:
    for step in measured:
        assert isinstance(step, ServedStep)
        # The runtime works for every request: CPU use above nothing, below this host's cores.
        assert step.cpu_cores is not None and 0.01 < step.cpu_cores <= 2.5


def test_a_cpu_host_reports_no_gpu_and_no_gpu_figures(measured: list[StepSummary]) -> None:
    assert all(isinstance(s, ServedStep) and s.gpus == 0 for s in measured)
    assert all(isinstance(s, ServedStep) and s.gpu_util_pct is None for s in measured)
    console = Console(width=220, record=True)
    console.print(steps_table(measured, SLO))
    assert console.export_text().count("no GPU") == len(measured)


def test_requests_split_by_prompt_length_at_the_edges(measured: list[StepSummary]) -> None:
    labels = {b.label for s in measured for b in s.by_length}
    assert labels == {"<64", "64-256", ">=256"}
    console = Console(width=200, record=True)
    console.print(length_table(measured[0].by_length))
    assert "ITL ms p50/95/99" in console.export_text()


def test_the_baseline_keeps_p95_itl_cpu_no_gpu_and_the_ranges(
    measured: list[StepSummary], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    shutil.copy(project.root() / "stacks" / "Pulumi.local.yaml", stacks)
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks))
    knee = find_knee(measured, SLO)
    assert knee is not None
    save_knee_baseline(settings_for("local"), knee, 1, "r-0123456789ab")
    baseline = load_baseline("local")
    assert baseline is not None
    assert baseline.ttft_p95_ms is not None and baseline.itl_p95_ms is not None
    assert baseline.cpu_cores is not None and baseline.cpu_cores > 0
    assert (baseline.gpus, baseline.gpu_util_pct, baseline.gpu_memory_bytes) == (0, None, None)
    assert {r.label for r in baseline.by_length} <= {"<64", "64-256", ">=256"}


def test_a_concurrency_sweep_prints_its_knee_as_the_groups_scale_in_utilisation(
    runtime: str, capsys: pytest.CaptureFixture[str]
) -> None:
    loadtest(
        Context(), stack="local", url=runtime, concurrency="1,2,4", duration=2, max_tokens=4, prompt_tokens=16
    )
    shown = capsys.readouterr().out
    assert "knee: " in shown and "requests in flight" in shown
    assert "autoscaling target: " in shown and "of runtime.max_concurrency" in shown
    assert "    - name: cpu\n      scale_in_utilisation: " in shown  # the local stack's group


def test_a_sweep_whose_levels_do_not_rise_is_refused_naming_the_option() -> None:
    with pytest.raises(Exit) as exit_:
        loadtest(Context(), stack="local", url="http://127.0.0.1:9", concurrency="4,2")
    assert exit_.value.code == 2
    assert "--concurrency 4,2: the levels of a sweep must rise strictly" in str(exit_.value.message)
