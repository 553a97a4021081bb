"""A spot notice on the local stack: the host is out of service before its end, and no client sees it.

Two host slots over real sshd, HAProxy with readiness checks, moto, the real runtime serving the
tiny model (the e2e ``cluster``). An IMDSv2 stand-in listens on host-1's own loopback address, and
host-1's agent — the files the deploy put under its ``bin/`` — runs its ``interruptions`` command
against it, polling every second (a setting; 5 s on EC2). Under a steady load through HAProxy a
spot notice is posted; the "instance" ends ``NOTICE_S`` later (120 s on EC2, shortened here): the
test then SIGKILLs whatever of host-1's runtime is left, as EC2 would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from frontier_hostside.interruption import read_record
from frontier_hostside.names import AGENT_CONFIG_NAME, AGENT_FILE_NAME

from frontier.loadtest.client import BackgroundLoad, Target
from frontier.targets import backend_for
from frontier.targets.local import cluster as local
from frontier.targets.local.imds import ImdsServer, Instance

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RATE = 1.5  # requests/s through the balancer
POLL_S = 1.0  # the agent's IMDS poll interval here (frontier_hostside.interruption.POLL_INTERVAL_S on EC2)
NOTICE_S = 20  # notice to the instance's end (EC2: 120 s)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=5) as reply:
        return json.loads(reply.read())


def test_a_spot_notice_takes_the_host_out_of_service_before_its_end_and_no_request_fails(cluster, capsys):
    settings = cluster.settings
    backend = backend_for(settings)
    host = backend.hosts()[0]
    balancer = backend.balancer()
    assert all(balancer.state(h) == "UP" for h in backend.hosts())
    imds = ImdsServer(host.address, 0, Instance(instance_id="i-0local000000host1")).start()
    bin_dir = Path(host.root) / "bin"
    watcher = subprocess.Popen(
        [sys.executable, str(bin_dir / AGENT_FILE_NAME), "--config", str(bin_dir / AGENT_CONFIG_NAME),
         "interruptions", "--imds", imds.url, "--interval", str(POLL_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    target = Target(
        base_url=local.balancer_url(settings),
        model=settings.model.name,
        api_key=local.api_key(settings),
        prompt_tokens=16,
        max_tokens=16,
        timeout_s=60,
    )
    load = BackgroundLoad(target, RATE, seed=41).start()
    try:
        time.sleep(2 * POLL_S)  # traffic flows, and the watcher has found no notice
        assert balancer.state(host) == "UP"
        noticed = time.monotonic()
        post(f"{imds.url}/control/spot", {"action": "terminate", "in_s": NOTICE_S})
        while balancer.state(host) == "UP":
            assert time.monotonic() - noticed < NOTICE_S, "the host was still in service at its end"
            time.sleep(0.05)
        out_s = time.monotonic() - noticed
        # The instance ends: what is left of host-1's runtime is killed, as EC2 would.
        time.sleep(max(0.0, NOTICE_S - (time.monotonic() - noticed)))
        pid_file = Path(host.root) / "run" / "runtime.pid"
        left = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
        alive = left is not None and Path(f"/proc/{left}").exists()
        if alive:
            os.kill(left, signal.SIGKILL)
        time.sleep(2)  # requests sent after the end go to host-2 alone
        samples = load.stop()
    finally:
        watcher.terminate()
        watcher.communicate(timeout=30)
        imds.stop()
    failed = [s.error for s in samples if not s.ok]
    record = read_record(Path(host.root) / "run")
    with capsys.disabled():
        print(
            f"\n  e2e: spot notice on {host.name}: out of HAProxy's rotation {out_s:.2f}s after the notice "
            f"(poll {POLL_S:g}s), drained {record[0].get('drained_after_s')}s after it was seen; "
            f"{len(samples)} requests, {len(failed)} failed"
        )
    assert not alive, "the runtime still ran when the instance ended: the drain did not finish in time"
    assert out_s < 5.0
    assert [(r["notice"]["kind"], r["out_of_service"]) for r in record] == [("spot", True)]
    assert samples and failed == []
