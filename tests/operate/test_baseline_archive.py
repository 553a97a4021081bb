"""Capacity baselines archived per release, and ``fab baseline.diff A B``: two releases' figures
side by side with ratios, regressions beyond the threshold flagged (and the exit status says so)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from invoke import Context
from invoke.exceptions import Exit

from frontier import project
from frontier.capacity.baseline import (
    Baseline,
    LengthFigures,
    archive_path,
    archived_releases,
    baseline_path,
    diff_baselines,
    load_archived,
    load_baseline,
    save_baseline,
)
from frontier.cli.config import baseline_diff
from frontier.errors import FrontierError

OLD, NEW, THIRD = "r-00000000000a", "r-00000000000b", "r-00000000000c"
MEASURED = Baseline(
    stack="local",
    measured_at="2026-12-01T10:00:00Z",
    replica_qps=16.0,
    output_tokens_per_s=560.0,
    p50_latency_ms=1000.0,
    p99_latency_ms=1500.0,
    ttft_p99_ms=600.0,
    hosts_measured=1,
    release_id=OLD,
)


@pytest.fixture(autouse=True)
def stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "stacks"
    shutil.copytree(project.root() / "stacks", target, ignore=shutil.ignore_patterns("baselines"))
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(target))
    return target


def later(**figures: float) -> Baseline:
    return replace(MEASURED, measured_at="2026-12-02T10:00:00Z", release_id=NEW, **figures)


def test_a_saved_baseline_is_archived_under_its_release_and_stays_the_latest(stacks: Path) -> None:
    assert save_baseline(MEASURED) == stacks / "baselines" / "local.json"
    assert archive_path("local", OLD) == stacks / "baselines" / "local" / f"{OLD}.json"
    assert load_archived("local", OLD) == MEASURED == load_baseline("local")


def test_a_new_release_archives_beside_the_old_one_and_replaces_only_the_latest() -> None:
    save_baseline(MEASURED)
    save_baseline(later(replica_qps=18.0))
    assert archived_releases("local") == [OLD, NEW]
    assert load_archived("local", OLD).replica_qps == 16.0
    assert load_baseline("local").replica_qps == 18.0


def test_measuring_a_release_again_replaces_its_archived_entry() -> None:
    save_baseline(MEASURED)
    save_baseline(replace(MEASURED, measured_at="2026-12-03T10:00:00Z", replica_qps=17.0))
    assert archived_releases("local") == [OLD] and load_archived("local", OLD).replica_qps == 17.0


def test_a_baseline_of_an_unknown_release_is_the_latest_but_not_archived() -> None:
    save_baseline(replace(MEASURED, release_id="unknown"))
    assert load_baseline("local").release_id == "unknown" and archived_releases("local") == []


def test_a_release_without_a_baseline_is_refused_naming_those_archived() -> None:
    save_baseline(MEASURED)
    with pytest.raises(
        FrontierError, match=rf"no baseline of release {THIRD} for stack 'local'; archived: {OLD}"
    ):
        load_archived("local", THIRD)


def test_a_malformed_release_id_is_refused_naming_it() -> None:
    with pytest.raises(FrontierError, match=r"release id '\.\./prod' is malformed"):
        load_archived("local", "../prod")


def test_an_archived_file_of_another_release_is_refused_naming_the_file() -> None:
    save_baseline(MEASURED)
    path = archive_path("local", OLD)
    shutil.copy(path, archive_path("local", THIRD))
    with pytest.raises(FrontierError, match=rf"{THIRD}.json: release_id = '{OLD}'"):
        load_archived("local", THIRD)


def test_the_diff_gives_each_figure_its_ratio_after_over_before() -> None:
    diffs = {d.name: d for d in diff_baselines(MEASURED, later(replica_qps=20.0, p99_latency_ms=1200.0))}
    assert diffs["replica_qps"].ratio == pytest.approx(1.25)
    assert diffs["p99_latency_ms"].ratio == pytest.approx(0.8)
    assert not any(d.regression for d in diffs.values())


def test_less_throughput_beyond_the_threshold_is_a_regression() -> None:
    diffs = {d.name: d for d in diff_baselines(MEASURED, later(output_tokens_per_s=490.0), threshold=0.1)}
    assert diffs["output_tokens_per_s"].regression  # 0.875 < 0.9


def test_more_latency_beyond_the_threshold_is_a_regression_and_within_it_is_not() -> None:
    diffs = {d.name: d for d in diff_baselines(MEASURED, later(ttft_p99_ms=700.0, p50_latency_ms=1050.0))}
    assert diffs["ttft_p99_ms"].regression and not diffs["p50_latency_ms"].regression


def test_a_threshold_out_of_range_is_refused_naming_it() -> None:
    with pytest.raises(FrontierError, match=r"--threshold = 0: must be a fraction > 0 and < 10"):
        diff_baselines(MEASURED, later(), threshold=0)


def test_fab_baseline_diff_prints_each_metric_for_a_and_b_with_its_change_and_verdict(capsys) -> None:
    save_baseline(MEASURED)
    save_baseline(later(replica_qps=18.0))
    baseline_diff(Context(), OLD, NEW, stack="local")
    out = capsys.readouterr().out
    assert f"baseline local: A {OLD}" in out and f"B {NEW}" in out
    row = next(line for line in out.splitlines() if "req/s per replica" in line)
    assert "16.0" in row and "18.0" in row and "+12.5 %" in row and "better" in row
    assert "REGRESSION" not in out


def test_a_figure_moved_less_than_the_threshold_is_the_same_either_way() -> None:
    diffs = {d.name: d for d in diff_baselines(MEASURED, later(p50_latency_ms=950.0, replica_qps=15.5))}
    assert diffs["p50_latency_ms"].verdict == diffs["replica_qps"].verdict == "same (within ±10%)"
    assert (diffs["p50_latency_ms"].change, diffs["replica_qps"].change) == ("-5.0 %", "-3.1 %")


def test_fab_baseline_diff_flags_a_regression_and_exits_non_zero(capsys) -> None:
    save_baseline(MEASURED)
    save_baseline(later(p99_latency_ms=2000.0))
    with pytest.raises(Exit) as exited:
        baseline_diff(Context(), OLD, NEW, stack="local", threshold=0.2)
    assert exited.value.code == 1 and "1 regression(s)" in str(exited.value.message)
    row = next(line for line in capsys.readouterr().out.splitlines() if "E2E latency p99" in line)
    assert "+33.3 %" in row and "REGRESSION" in row


def test_the_archive_is_pretty_json_of_every_field() -> None:
    save_baseline(MEASURED)
    data = json.loads(archive_path("local", OLD).read_text())
    assert data["release_id"] == OLD and data["replica_qps"] == 16.0 and len(data) == 9
    assert baseline_path("local").read_text() == archive_path("local", OLD).read_text()


MEASURED_FULLY = replace(
    MEASURED,
    p95_latency_ms=1300.0,
    ttft_p50_ms=200.0,
    ttft_p95_ms=450.0,
    itl_p50_ms=20.0,
    itl_p95_ms=30.0,
    itl_p99_ms=40.0,
    cpu_cores=1.5,
    gpus=0,
    by_length=(
        LengthFigures(label="<256", requests=40, ttft_p95_ms=300.0, itl_p95_ms=25.0, e2el_p95_ms=900.0),
        LengthFigures(label="1k-4k", requests=10, ttft_p95_ms=900.0, itl_p95_ms=35.0, e2el_p95_ms=2000.0),
    ),
)


def test_the_diff_covers_p95_itl_and_cpu_use() -> None:
    after = replace(MEASURED_FULLY, release_id=NEW, ttft_p95_ms=540.0, itl_p95_ms=30.0, cpu_cores=1.9)
    diffs = {d.name: d for d in diff_baselines(MEASURED_FULLY, after) if not d.length}
    assert diffs["ttft_p95_ms"].regression and diffs["ttft_p95_ms"].change == "+20.0 %"
    assert not diffs["itl_p95_ms"].regression
    assert diffs["cpu_cores"].regression  # 1.9 / 1.5 = +26.7 % more CPU for the same knee


def test_the_diff_compares_each_input_length_range_both_measured() -> None:
    slower = LengthFigures(
        label="1k-4k", requests=12, ttft_p95_ms=1200.0, itl_p95_ms=35.0, e2el_p95_ms=2100.0
    )
    after = replace(MEASURED_FULLY, release_id=NEW, by_length=(MEASURED_FULLY.by_length[0], slower))
    ranged = [d for d in diff_baselines(MEASURED_FULLY, after) if d.length]
    assert {(d.length, d.name) for d in ranged if d.regression} == {("1k-4k", "ttft_p95_ms")}
    assert len(ranged) == 6  # two ranges of three figures


def test_a_cpu_host_s_gpu_figures_read_no_gpu_and_are_never_a_regression() -> None:
    same = replace(MEASURED_FULLY, release_id=NEW)
    gpu = {d.name: d for d in diff_baselines(MEASURED_FULLY, same) if not d.length}
    assert (gpu["gpu_util_pct"].before_note, gpu["gpu_util_pct"].verdict) == ("no GPU", "not compared")
    assert not gpu["gpu_memory_bytes"].regression


def test_a_baseline_measured_before_the_new_figures_diffs_them_as_not_measured(capsys) -> None:
    save_baseline(MEASURED)  # no p95, ITL, CPU or ranges: written before they were measured
    save_baseline(replace(MEASURED_FULLY, release_id=NEW, measured_at="2026-12-02T10:00:00Z"))
    baseline_diff(Context(), OLD, NEW, stack="local")
    row = next(line for line in capsys.readouterr().out.splitlines() if "TTFT p95" in line)
    assert "not measured" in row and "450.0" in row and "not compared" in row


def test_every_new_figure_and_range_survives_the_archive() -> None:
    save_baseline(MEASURED_FULLY)
    assert load_archived("local", OLD) == MEASURED_FULLY
