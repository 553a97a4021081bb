"""Self-healing, shown: SIGKILL a host slot's runtime and time its way back into rotation.

Nothing here restarts anything: the host agent's supervisor (``frontier-agent.py supervise``, the
same that runs under systemd on a cloud host) sees its runtime exit and starts it again, and
HAProxy's health check puts the host back. This module only pulls the trigger and watches the
clock, for ``make demo`` and the self-healing tests.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec


@dataclass(frozen=True)
class Recovery:
    host: str
    killed_pid: int
    relaunched_s: float  # the supervisor started a new runtime process
    ready_s: float  # its readiness check answers 200 (weights loaded, warmed up)
    in_rotation_s: float  # HAProxy's health check has put the host back


def runtime_pid(host: HostSpec) -> int:
    """The pid of the runtime the slot's agent started (its ``run/runtime.pid``)."""
    path = Path(host.root) / "run" / "runtime.pid"
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        raise FrontierError(f"{host.name}: no runtime pid in {path}: is a release running there?") from None


def runtime_url(pool: PoolSettings, host: HostSpec, path: str) -> str:
    """``path`` on the runtime of the host slot ``host``, a slot of ``pool``."""
    return f"http://{host.address}:{pool.runtime.port}{path}"


def ready(settings: Settings, pool: PoolSettings, host: HostSpec) -> bool:
    """The runtime of ``host``, a slot of ``pool``, answers its readiness check."""
    url = runtime_url(pool, host, settings.health.readiness_path)
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise FrontierError(f"{what} within {timeout:.0f}s")
        time.sleep(0.05)


def kill_and_recover(
    settings: Settings, pool: PoolSettings, host: HostSpec, balancer: Balancer, timeout: float = 120.0
) -> Recovery:
    """SIGKILL the runtime of ``host``, a slot of ``pool``; return once its supervisor's restart is
    back in rotation."""
    killed = runtime_pid(host)
    os.kill(killed, signal.SIGKILL)
    started = time.perf_counter()

    def relaunched() -> bool:
        try:
            return runtime_pid(host) != killed
        except FrontierError:
            return False  # between the old pid file and the new one

    _until(relaunched, 30, f"{host.name}: the supervisor did not relaunch the runtime")
    relaunched_s = time.perf_counter() - started
    _until(lambda: ready(settings, pool, host), timeout, f"{host.name}: the relaunched runtime was not ready")
    ready_s = time.perf_counter() - started
    _until(lambda: balancer.state(host) == "UP", 60, f"{host.name}: HAProxy did not put it back")
    return Recovery(host.name, killed, relaunched_s, ready_s, time.perf_counter() - started)
