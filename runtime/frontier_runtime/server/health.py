"""Liveness and readiness, kept apart (as Triton does) so a balancer and a supervisor can differ.

* live  = the process answers and the engine loop is still advancing (its heartbeat is recent).
  Nothing else: a saturated server is alive, and restarting it would only lose its work.
* ready = weights loaded, a warm-up forward done, not draining, engine loop not stuck. A balancer
  sends traffic only to ready targets; readiness turns false the moment draining starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Health:
    stuck_after_s: float
    heartbeat: Callable[[], float | None] = field(default=lambda: None)
    engine_running: Callable[[], bool] = field(default=lambda: True)
    weights_loaded: bool = False
    warmed_up: bool = False
    draining: bool = False

    def heartbeat_age_s(self) -> float | None:
        beat = self.heartbeat()
        return None if beat is None else max(0.0, time.monotonic() - beat)

    def loop_stuck(self) -> bool:
        """The engine loop died, or has not advanced for ``stuck_after_s``."""
        if self.weights_loaded and not self.engine_running():
            return True
        age = self.heartbeat_age_s()
        return age is not None and age > self.stuck_after_s

    def live(self) -> tuple[bool, dict[str, Any]]:
        age = self.heartbeat_age_s()
        ok = not self.loop_stuck()
        return ok, {"status": "ok" if ok else "engine loop stuck", "heartbeat_age_s": _round(age)}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        reasons = []
        if not self.weights_loaded:
            reasons.append("weights not loaded")
        if not self.warmed_up:
            reasons.append("warm-up not done")
        if self.draining:
            reasons.append("draining")
        if self.loop_stuck():
            reasons.append("engine loop stuck")
        detail = {
            "status": "ready" if not reasons else "not ready",
            "reasons": reasons,
            "weights_loaded": self.weights_loaded,
            "warmed_up": self.warmed_up,
            "draining": self.draining,
            "heartbeat_age_s": _round(self.heartbeat_age_s()),
        }
        return not reasons, detail


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
