"""The capacity baseline file: written by the load test, read by the planner."""

from __future__ import annotations

import json

import pytest

from frontier.capacity.baseline import Baseline, baseline_path, load_baseline, save_baseline
from frontier.errors import FrontierError

FIELDS = dict(
    stack="prod",
    measured_at="2026-11-30T10:00:00Z",
    replica_qps=18.5,
    output_tokens_per_s=6400.0,
    p50_latency_ms=900.0,
    p99_latency_ms=4100.0,
    ttft_p99_ms=650.0,
    hosts_measured=2,
    release_id="r-abc123",
)


@pytest.fixture(autouse=True)
def _stacks_dir(stacks_copy, monkeypatch):
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))


def test_no_baseline_yet_is_none():
    assert load_baseline("prod") is None


def test_saved_baseline_loads_back_equal(stacks_copy):
    baseline = Baseline(**FIELDS)
    path = save_baseline(baseline)
    assert path == stacks_copy / "baselines" / "prod.json"
    assert load_baseline("prod") == baseline


def test_baseline_file_is_pretty_sorted_json():
    path = save_baseline(Baseline(**FIELDS))
    text = path.read_text()
    assert text == json.dumps(FIELDS, indent=2, sort_keys=True) + "\n"


def test_damaged_baseline_is_an_error_naming_the_file():
    path = baseline_path("prod")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(FrontierError, match=rf"{path}: not valid JSON"):
        load_baseline("prod")


def test_baseline_missing_a_field_is_an_error():
    path = save_baseline(Baseline(**FIELDS))
    data = json.loads(path.read_text())
    del data["replica_qps"]
    path.write_text(json.dumps(data))
    with pytest.raises(FrontierError, match="expected the fields"):
        load_baseline("prod")


def test_baseline_of_another_stack_is_refused():
    path = save_baseline(Baseline(**FIELDS))
    path.rename(baseline_path("staging"))
    with pytest.raises(FrontierError, match="stack = 'prod', but this is the baseline file of 'staging'"):
        load_baseline("staging")


@pytest.mark.parametrize("field", ["replica_qps", "output_tokens_per_s"])
def test_baseline_throughput_must_be_positive(field):
    with pytest.raises(FrontierError, match=rf"{field} = 0: must be a number > 0"):
        Baseline(**{**FIELDS, field: 0})
