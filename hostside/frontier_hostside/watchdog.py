"""The supervisor where systemd runs: :class:`Watchdog` (``frontier-agent.service``).

Standard library only, Python 3.8 and later: it travels beside ``frontier-agent.py``
(``frontier_hostside.IMPORTED_FILES``), which the unit runs as ``supervise``.
"""

from __future__ import annotations

from typing import Any

from frontier_hostside.keeper import Keeper, RuntimeHost


class Watchdog(Keeper):
    """The supervisor where systemd runs (``frontier-agent.service``, installed by ``start``).

    systemd already restarts a runtime that exits (``Restart=on-failure`` in the release's unit).
    The watchdog covers a runtime that still runs but no longer answers: while the runtime's unit
    is active it probes it (:class:`Keeper`) and runs ``systemctl restart`` on the unit when
    liveness fails. A stopped unit (a rollout's stop phase) is left alone; stopping the watchdog
    never stops the runtime.
    """

    def __init__(self, agent: RuntimeHost) -> None:
        super().__init__(agent, state="watching")

    def run(self) -> dict[str, Any]:
        self._take_charge()
        self._save()
        while not self.stopping:
            if not self.agent.is_running():
                self.up, self.failures = False, 0
                self._pause(self.config.liveness_interval_s)
                continue
            wait = self._probe_wait()
            reason = self._probe()
            if reason:
                self._went_down()
                self.agent.systemctl("restart", self.agent.unit, check=False)
                self._restarted(reason, unit=self.agent.unit)
            self._pause(wait)
        return {"supervised": False, "restarts": self.state["restarts"]}
