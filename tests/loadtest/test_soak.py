"""A soak: what it reads of each replica, and how it judges leaks, drift and restarts.

The judging tests build readings by hand; the last two hold a real runtime process under load and
read its real /metrics, once left alone and once killed half-way."""

from __future__ import annotations

import threading

import httpx
import pytest

from frontier.loadtest.client import Target
from frontier.loadtest.soak import (
    MB,
    ReplicaReading,
    SoakError,
    SoakLimits,
    SoakReport,
    Window,
    count_restarts,
    judge,
    read_replica,
    rss_slope_mb_per_h,
    run_soak,
)
from frontier.loadtest.stats import RequestSample


def _reading(at: float, rss_mb: float, kv: float = 0.1, started: float = 1000.0) -> ReplicaReading:
    return ReplicaReading(at, "host-1", rss_mb * MB, kv, started)


def test_the_rss_slope_is_the_least_squares_line_in_mb_per_hour():
    # +10 MB every 360 s is +100 MB/h. A point 3 MB high at t = 720 (540 s is the mean time) tilts
    # the line by 3 x 180 / (540^2 + 180^2 + 180^2 + 540^2) MB/s = 3 MB/h: 103 MB/h.
    readings = [_reading(t, 500 + t / 36) for t in (0, 360, 720, 1080)]
    readings[2] = _reading(720, 500 + 720 / 36 + 3)
    assert rss_slope_mb_per_h(readings) == pytest.approx(103.0)
    assert rss_slope_mb_per_h(readings[:2]) is None  # two points say nothing of a trend


def test_a_changed_start_time_or_a_silent_replica_counts_as_a_restart():
    readings = [
        _reading(0, 500),
        _reading(10, 500),
        ReplicaReading(20, "host-1", None, None, None),  # did not answer
        _reading(30, 400, started=1025.0),  # a new process
    ]
    assert count_restarts(readings) == {"host-1": 2}


def test_metrics_text_gives_rss_kv_usage_and_start_time():
    text = (
        "process_resident_memory_bytes 5.24288e+08\n"
        "process_start_time_seconds 1.7e+09\n"
        'frontier_kv_cache_usage_ratio{model="m"} 0.25\n'
    )
    from frontier_hostside.names import KV_USAGE_METRIC

    reading = read_replica("host-1", 3.0, text.replace("frontier_kv_cache_usage_ratio", KV_USAGE_METRIC))
    assert (reading.rss_bytes, reading.kv_usage, reading.started_at) == (500 * MB, 0.25, 1.7e9)
    assert read_replica("host-1", 3.0, None).rss_bytes is None


def _report(rss_per_window: list[float], *, failed_late: int = 0, idle_kv_after: float = 0.0) -> SoakReport:
    windows = []
    for i, rss in enumerate(rss_per_window):
        late = i >= len(rss_per_window) * 3 // 4
        samples = tuple(
            RequestSample(sent_at=i * 60 + j, ok=not (late and j < failed_late), ttft_s=0.05, e2el_s=0.5)
            for j in range(20)
        )
        windows.append(Window(i * 60.0, (i + 1) * 60.0, samples, (_reading((i + 1) * 60.0, rss, kv=0.4),)))
    idle = (_reading(0, rss_per_window[0], kv=0.0),)
    after = (_reading(len(windows) * 60.0, rss_per_window[-1], kv=idle_kv_after),)
    return SoakReport(2.0, len(windows) * 60.0, tuple(windows), idle, after)


def _verdicts(report: SoakReport, limits: SoakLimits = SoakLimits()) -> dict[str, bool]:
    return {c.name: c.ok for c in judge(report, limits)}


def test_a_steady_soak_passes_every_check():
    assert all(_verdicts(_report([500.0] * 12)).values())


def test_memory_that_grows_with_the_load_is_a_leak():
    # +2 MB a minute = +120 MB/h, over the 64 MB/h limit.
    verdicts = _verdicts(_report([500.0 + 2 * i for i in range(12)]))
    assert verdicts["RSS growth, host-1"] is False
    assert all(ok for name, ok in verdicts.items() if name != "RSS growth, host-1")


def test_kv_blocks_still_held_when_idle_are_a_leak():
    assert (
        _verdicts(_report([500.0] * 12, idle_kv_after=0.1))["KV cache usage idle, after vs before"] is False
    )


def test_errors_that_appear_late_are_drift():
    assert _verdicts(_report([500.0] * 12, failed_late=2))["error rate, last quarter vs first"] is False


def test_limits_out_of_range_are_refused_naming_the_flag():
    with pytest.raises(SoakError, match="--kv-peak-usage 1.5"):
        SoakLimits(kv_peak_usage=1.5)
    with pytest.raises(SoakError, match="--p99-drift 0.5"):
        SoakLimits(p99_drift=0.5)


def test_a_soak_shorter_than_four_intervals_is_refused():
    target = Target(base_url="http://127.0.0.1:9", model="m")
    with pytest.raises(SoakError, match="--duration 10s: must be at least 4 x --interval"):
        run_soak(target, ["r"], lambda r: None, rate=1, duration_s=10, interval_s=5, limits=SoakLimits())


@pytest.fixture
def runtime(tmp_path):
    from frontier_runtime.tiny import make_tiny_checkpoint

    from tests.gateway.harness import start_runtime, wait_ready

    model_dir = make_tiny_checkpoint(tmp_path / "tiny-soak", seed=3)
    process = start_runtime("tiny-soak", model_dir, tmp_path / "work")
    try:
        wait_ready([process])
        yield process
    finally:
        process.kill()


def _read(runtime) -> str | None:
    try:
        return httpx.get(runtime.url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None


@pytest.mark.e2e
def test_a_real_runtime_under_a_short_soak_passes_with_zero_failed_requests(runtime):
    target = Target(base_url=runtime.url, model="tiny-soak", prompt_tokens=16, max_tokens=8)
    report = run_soak(
        target, ["rt"], lambda r: _read(runtime), rate=4, duration_s=8, interval_s=1, limits=SoakLimits()
    )
    assert report.sent >= 16 and report.failed == 0
    checks = {c.name: c for c in report.checks}
    assert checks["restarts or replicas not answering"].ok
    assert checks["KV cache usage idle, after vs before"].ok, checks["KV cache usage idle, after vs before"]
    assert all(r.rss_bytes and r.rss_bytes > 50 * MB for w in report.windows for r in w.readings)


@pytest.mark.e2e
def test_a_runtime_killed_during_a_soak_fails_it_naming_the_replica(runtime):
    target = Target(base_url=runtime.url, model="tiny-soak", prompt_tokens=16, max_tokens=8, timeout_s=5)
    threading.Timer(3.0, runtime.process.kill).start()
    report = run_soak(
        target, ["rt"], lambda r: _read(runtime), rate=4, duration_s=6, interval_s=1, limits=SoakLimits()
    )
    restarts = next(c for c in report.checks if c.name == "restarts or replicas not answering")
    assert not restarts.ok and restarts.measured.startswith("rt: ")
    assert not report.ok
