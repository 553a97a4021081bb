"""The runtime's parent on hosts without systemd: :class:`Supervisor`.

Standard library only, Python 3.8 and later: it travels beside ``frontier-agent.py``
(``frontier_hostside.IMPORTED_FILES``), which runs it as ``supervise``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from frontier_hostside.keeper import SUPERVISOR_TICK_S, Keeper, RuntimeHost
from frontier_hostside.processes import terminate_then_kill

# Restarts of a runtime that dies before it is ready again wait 1, 2, 4 ... s, at most this long.
MAX_BACKOFF_S = 30.0


class Supervisor(Keeper):
    """The runtime's parent on hosts without systemd: it launches the runtime as its own child.

    ``start`` runs ``agent.py supervise`` detached. Every ``SUPERVISOR_TICK_S`` the supervisor
    looks at its child:

    * it exits, or it fails its liveness probes (:class:`Keeper`) → the supervisor stops what is
      left of it (SIGTERM, drain, SIGKILL) and launches it again: at once the first time, then
      after 1, 2, 4 … 30 s while runtimes keep exiting before they are ready (a crash loop backs
      off, as Kubernetes' does);
    * a runtime that exits before it is ready is counted (``exits_before_ready``): ``wait-ready``
      fails at once on it, so a release that cannot start fails its rollout's readiness phase
      (which then stops the host or rolls it back) instead of waiting out the timeout;
    * the host's record names another supervisor, or none (its root was cleared or removed) → it
      stops: an orphan must not keep a runtime alive.

    SIGTERM stops the supervisor: it stops its runtime and records how (``stop_outcome``).
    """

    def __init__(self, agent: RuntimeHost, release: Path) -> None:
        super().__init__(agent, release=release.name, runtime_pid=None, state="starting")
        self.release = release
        self.dying_young = 0  # runtimes in a row that exited before they were ready

    def release_name(self) -> str:
        return self.release.name

    def _launch(self, word: str) -> subprocess.Popen[bytes]:
        child = self.agent.launch(self.release, word)
        self.state["runtime_pid"] = child.pid
        self._save()
        return child

    def _still_in_charge(self) -> bool:
        try:
            return int(self.agent.supervisor_pid_file.read_text().split()[0]) == os.getpid()
        except (OSError, ValueError, IndexError):
            return False

    def _ready(self) -> None:
        self.dying_young = 0
        self.state.update(state="serving", exits_before_ready=0)
        self._save()

    def run(self) -> dict[str, Any]:
        self._take_charge()
        child = self._launch("start")
        self._event("start", pid=child.pid)
        next_probe = time.monotonic()
        while not self.stopping:
            if not self._still_in_charge():
                self.stopping = True
                break
            status = child.poll()
            reason = ""
            if status is not None:
                reason = f"the runtime exited with status {status}"
                if not self.up:
                    reason += " before it was ready"
                    # wait-ready reads this: a release that cannot start fails its rollout at once.
                    self.state["exits_before_ready"] = self.state.get("exits_before_ready", 0) + 1
            elif time.monotonic() >= next_probe:
                next_probe = time.monotonic() + self._probe_wait()
                reason = self._probe(pid=child.pid)
            if reason:
                self.dying_young = 0 if self.up else self.dying_young + 1
                self._went_down()
                fresh = self._restart(child, reason)
                if fresh is None:
                    return self._stopped(child, str(self.state.get("stop_outcome", "terminated")))
                child = fresh
                next_probe = time.monotonic()
                continue
            time.sleep(SUPERVISOR_TICK_S)
        return self._stopped(
            child, terminate_then_kill(child.pid, self.config.drain_timeout_s + 5, process=child)
        )

    def _stopped(self, child: subprocess.Popen[bytes], outcome: str) -> dict[str, Any]:
        self.state.update(state="stopped", stop_outcome=outcome)
        with contextlib.suppress(OSError):  # an orphan's root may be gone
            self._save()
            self._event("stop", pid=child.pid, outcome=outcome, restarts=self.state["restarts"])
        return {"supervised": False, "stop_outcome": outcome, "restarts": self.state["restarts"]}

    def _restart(self, child: subprocess.Popen[bytes], reason: str) -> subprocess.Popen[bytes] | None:
        """Stop what is left of ``child`` and launch the release again; None when asked to stop meanwhile."""
        self.state["state"] = "restarting"
        self._save()
        outcome = terminate_then_kill(child.pid, self.config.drain_timeout_s + 5, process=child)
        if self.dying_young > 1:
            self._pause(min(MAX_BACKOFF_S, 2.0 ** (self.dying_young - 2)))
        if self.stopping:
            self.state["stop_outcome"] = outcome
            return None
        fresh = self._launch("restart")
        self._restarted(reason, old_pid=child.pid, pid=fresh.pid, old_outcome=outcome)
        return fresh
