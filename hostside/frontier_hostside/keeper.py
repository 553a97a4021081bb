"""Keeping a host's runtime serving: :class:`Keeper`, the base of the supervisor and the watchdog.

A keeper runs as ``frontier-agent.py supervise``: the agent picks the one that fits the host
(:mod:`frontier_hostside.supervisor` without systemd, :mod:`frontier_hostside.watchdog` with it)
and hands itself over as the :class:`RuntimeHost` the keeper works on. Standard library only,
Python 3.8 and later: it travels beside ``frontier-agent.py`` (``frontier_hostside.IMPORTED_FILES``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

from frontier_hostside.names import CURRENT_LINK
from frontier_hostside.processes import atomic_write, now

# How often the supervisor looks at its child, and how long it waits for a fresh one to be ready
# (a fresh one is probed for readiness that often too, so the recovery time is measured closely).
SUPERVISOR_TICK_S = 0.1
READY_PROBE_S = 0.1


# Protocols, not the agent's classes: the agent is the script that runs the keepers
# (frontier-agent.py), and a host has no module of it that they could import.


class HealthConfig(Protocol):
    """The agent's configuration (``AgentConfig``) as far as a keeper reads it."""

    @property
    def host(self) -> str: ...
    @property
    def readiness_path(self) -> str: ...
    @property
    def liveness_path(self) -> str: ...
    @property
    def liveness_interval_s(self) -> float: ...
    @property
    def liveness_timeout_s(self) -> float: ...
    @property
    def liveness_failures(self) -> int: ...
    @property
    def drain_timeout_s(self) -> float: ...


class RuntimeHost(Protocol):
    """The agent (``Agent``) as a keeper uses it: one host's runtime, its records, its probes."""

    @property
    def config(self) -> HealthConfig: ...

    unit: str  # the runtime's systemd unit
    run_dir: Path
    history_file: Path
    supervisor_pid_file: Path
    supervisor_state_file: Path

    def link(self, name: str) -> str: ...
    def http_status(self, path: str, timeout: float = ...) -> int: ...
    def is_running(self) -> bool: ...
    def systemctl(self, *args: str, check: bool = ...) -> subprocess.CompletedProcess[str]: ...
    def launch(self, release: Path, word: str = ...) -> subprocess.Popen[bytes]: ...


class Keeper:
    """What the supervisor and the watchdog share: keeping the current release's runtime serving.

    Either runs as ``agent.py supervise`` (the agent picks the one that fits the host), records its
    pid in ``run/supervisor.pid`` and stops on SIGTERM. Either probes readiness until the runtime
    has answered ready, so loading a model is never mistaken for a hang, then liveness every
    ``liveness_interval_s`` (each probe waiting up to ``liveness_timeout_s``), and restarts the
    runtime after ``liveness_failures`` failed probes in a row; how it restarts is its own. Every
    restart is counted in ``run/supervisor.json`` (``status`` reports it) and written to
    ``logs/agent.jsonl`` with its reason, and the measured time until the runtime answered ready
    again as a ``recovered`` line.
    """

    def __init__(self, agent: RuntimeHost, **state: Any) -> None:
        self.agent = agent
        self.config = agent.config
        self.stopping = False
        self.state: dict[str, Any] = {"pid": os.getpid(), "restarts": 0, "last_restart": None, **state}
        self.up = False  # the runtime has answered ready since it was (re)started
        self.failures = 0  # liveness probes failed in a row
        self.down_since: float | None = None  # when the last restart began, until it answers ready

    def release_name(self) -> str:
        return self.agent.link(CURRENT_LINK)

    def _on_stop(self, *_args: object) -> None:
        self.stopping = True

    def _take_charge(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        self.agent.run_dir.mkdir(parents=True, exist_ok=True)
        self.agent.history_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.agent.supervisor_pid_file, f"{os.getpid()}\n")

    def _save(self) -> None:
        atomic_write(self.agent.supervisor_state_file, json.dumps(self.state, sort_keys=True) + "\n")

    def _event(self, event: str, **details: Any) -> None:
        line = {
            "at": now(),
            "host": self.config.host,
            "event": event,
            "release": self.release_name(),
            **details,
        }
        with self.agent.history_file.open("a") as out:
            out.write(json.dumps(line, sort_keys=True) + "\n")

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(SUPERVISOR_TICK_S, max(0.0, deadline - time.monotonic())))

    def _probe_wait(self) -> float:
        """Until the next probe: readiness is probed often, so the recovery time is measured closely."""
        return READY_PROBE_S if not self.up else self.config.liveness_interval_s

    def _probe(self, **details: Any) -> str:
        """One probe (readiness until the runtime has answered ready, liveness after); the reason to
        restart the runtime, or ''. ``details`` go into the ``recovered`` line."""
        timeout = self.config.liveness_timeout_s
        if not self.up:
            if self.agent.http_status(self.config.readiness_path, timeout) == 200:
                self.up, self.failures = True, 0
                self._ready()
                if self.down_since is not None:
                    after_s = round(time.monotonic() - self.down_since, 3)
                    self._event("recovered", **details, after_s=after_s)
                    self.down_since = None
            return ""
        if self.agent.http_status(self.config.liveness_path, timeout) == 200:
            self.failures = 0
        else:
            self.failures += 1
            if self.failures >= self.config.liveness_failures:
                return f"liveness failed {self.failures} times in a row"
        return ""

    def _ready(self) -> None:
        """The runtime has answered ready (after a start or a restart)."""

    def _went_down(self) -> None:
        """The runtime is to be restarted: it counts as down until it answers ready again."""
        self.down_since = time.monotonic()
        self.up, self.failures = False, 0

    def _restarted(self, reason: str, **details: Any) -> None:
        self.state["restarts"] += 1
        self.state["last_restart"] = {"at": now(), "reason": reason}
        self._save()
        self._event("restart", reason=reason, restarts=self.state["restarts"], **details)
