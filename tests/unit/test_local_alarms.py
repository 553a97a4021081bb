"""The local stack's alarm evaluator without a cluster: the runtime-down rule, and its reading of a
process's CPU seconds and resident memory from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frontier.errors import FrontierError
from frontier.targets.local.alarms import RuntimeDown, process_usage


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
