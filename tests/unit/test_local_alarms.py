"""The local stack's alarm evaluator without a cluster: the runtime-down rule, the named alarms on the
runtime's metrics (frontier/alarms.py), and its reading of a process's CPU seconds and resident
memory from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from frontier_hostside.names import (
    KV_USAGE_METRIC,
    REASON_LABEL,
    REQUEST_FAILURES_METRIC,
    STRUCTURED_OUTPUT_INVALID,
    STRUCTURED_OUTPUTS_METRIC,
    TTFT_METRIC,
)

from frontier.alarms import NAMED_ALARMS, RuntimeMetricAlarm
from frontier.errors import FrontierError
from frontier.targets import load_stack
from frontier.targets.local.alarms import MetricWatch, RuntimeDown, local_watches, process_usage


def test_runtime_down_fires_once_unready_for_the_limit_and_clears_when_ready():
    down = RuntimeDown("page", after_s=2.0)
    assert down.observe("host-1", watched=True, is_ready=False, now=100.0) is None
    assert down.observe("host-1", watched=True, is_ready=False, now=101.9) is None
    fired = down.observe("host-1", watched=True, is_ready=False, now=102.0)
    assert (fired.alarm, fired.old, fired.new, fired.severity) == ("runtime-down", "OK", "ALARM", "page")
    assert down.observe("host-1", watched=True, is_ready=False, now=105.0) is None  # once, not every round
    cleared = down.observe("host-1", watched=True, is_ready=True, now=106.0)
    assert (cleared.old, cleared.new, cleared.at) == ("ALARM", "OK", 106.0)


def test_a_host_a_rollout_holds_out_never_fires_however_long_it_is_unready():
    down = RuntimeDown("page", after_s=1.0)
    for second in range(10):
        assert down.observe("host-1", watched=False, is_ready=False, now=float(second)) is None
    # Back from the rollout and still unready: the count starts there.
    assert down.observe("host-1", watched=True, is_ready=False, now=10.0) is None
    assert down.observe("host-1", watched=True, is_ready=False, now=11.0).new == "ALARM"


def test_process_usage_reads_cpu_seconds_and_resident_memory_from_proc():
    before = process_usage(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn some CPU of our own
        pass
    after = process_usage(os.getpid())
    assert after.cpu_user_s + after.cpu_system_s >= before.cpu_user_s + before.cpu_system_s + 0.2
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    vm_rss = int(status["VmRSS"].split()[0]) * 1024
    assert abs(after.rss_bytes - vm_rss) < 0.1 * vm_rss


def test_a_process_that_is_gone_is_named():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(FrontierError, match=f"pid {child.pid}: no such process"):
        process_usage(child.pid)


def scrape_of(kv: float, checked: float, failed: float, ttft: dict[str, float]) -> list:
    """One scrape of a runtime's /metrics as the evaluator parses it."""
    reason = {REASON_LABEL: STRUCTURED_OUTPUT_INVALID}
    return [
        (KV_USAGE_METRIC, {"model_name": "m"}, kv),
        (f"{STRUCTURED_OUTPUTS_METRIC}_total", {}, checked),
        (f"{REQUEST_FAILURES_METRIC}_total", reason, failed),
        *((f"{TTFT_METRIC}_bucket", {"le": le, "model_name": "m"}, n) for le, n in ttft.items()),
    ]


def watch_of(name: str, threshold: float) -> MetricWatch:
    alarm = NAMED_ALARMS[name]
    assert isinstance(alarm, RuntimeMetricAlarm)
    return MetricWatch(alarm, "warn", threshold)


def test_the_local_stack_watches_every_named_alarm_with_its_settings():
    settings = load_stack("local")
    watches = local_watches(settings)
    assert sorted(watches.names()) == sorted(NAMED_ALARMS)
    thresholds = {w.alarm.name: w.threshold for w in watches.metrics}
    assert thresholds == {
        "ttft": settings.slo.ttft_ms,
        "kv-cache-full": settings.monitoring.kv_usage_alarm,
        "structured-output-failures": settings.slo.error_rate,
    }
    assert watches.down.after_s == settings.alerts.runtime_down_for_s


def test_ttft_fires_on_the_p99_of_the_requests_since_the_last_scrape_and_clears():
    watch = watch_of("ttft", threshold=500.0)  # ms
    assert watch.observe("host-1", scrape_of(0, 0, 0, {"0.1": 10, "1.0": 10, "+Inf": 10}), 1.0) is None
    # 100 new requests, 2 of them slower than 0.1 s: the p99 is in the 1 s bucket.
    fired = watch.observe("host-1", scrape_of(0, 0, 0, {"0.1": 108, "1.0": 110, "+Inf": 110}), 2.0)
    assert fired is not None and (fired.alarm, fired.new, fired.host) == ("ttft", "ALARM", "host-1")
    assert "1000 is above the threshold 500" in fired.reason
    # No request since: nothing to judge, the alarm stays.
    assert watch.observe("host-1", scrape_of(0, 0, 0, {"0.1": 108, "1.0": 110, "+Inf": 110}), 3.0) is None
    cleared = watch.observe("host-1", scrape_of(0, 0, 0, {"0.1": 208, "1.0": 210, "+Inf": 210}), 4.0)
    assert cleared is not None and cleared.new == "OK"


def test_a_full_kv_cache_fires_per_host():
    watch = watch_of("kv-cache-full", threshold=0.95)
    assert watch.observe("host-1", scrape_of(0.5, 0, 0, {}), 1.0) is None
    fired = watch.observe("host-2", scrape_of(0.99, 0, 0, {}), 1.0)
    assert fired is not None and fired.host == "host-2" and fired.new == "ALARM"


def test_structured_output_failures_are_a_rate_of_the_outputs_checked_since_the_last_scrape():
    watch = watch_of("structured-output-failures", threshold=0.05)
    # The first scrape judges the runtime's life so far: 2 %, quiet.
    assert watch.observe("host-1", scrape_of(0, 100, 2, {}), 1.0) is None
    assert watch.observe("host-1", scrape_of(0, 200, 3, {}), 2.0) is None  # 1 % since
    fired = watch.observe("host-1", scrape_of(0, 300, 13, {}), 3.0)  # 10 % since
    assert fired is not None and fired.new == "ALARM" and "0.1 is above the threshold 0.05" in fired.reason
    # A restarted runtime counts from zero: its own counts are the rate.
    cleared = watch.observe("host-1", scrape_of(0, 50, 0, {}), 4.0)
    assert cleared is not None and cleared.new == "OK"
