"""A circuit breaker per replica: a replica that keeps failing is taken out before clients pay for it.

Readiness probes see a replica that is down; they do not see one that answers its probe and then
fails real requests (a broken GPU, a model that throws). The breaker counts each replica's answers
over a sliding window; once it holds ``min_requests`` and the share of failures exceeds
``error_rate``, the breaker opens: the replica takes no request for ``cool_off_s``. Then it is
half-open: exactly one trial request goes to it; success closes the breaker (a fresh window),
failure opens it for another cool-off.

A failure is what says the replica is broken, not busy or leaving: a refused or broken connection,
a 500, 502 or 504. A 429 (queue full) and a 503 (draining, not ready) are the runtime working as
designed and count as neither.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from enum import Enum

from frontier_gateway.config import BreakerConfig

log = logging.getLogger("frontier_gateway.breaker")

FAILURES = frozenset({500, 502, 504})
NEUTRAL = frozenset({429, 503})


class State(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    def __init__(
        self, config: BreakerConfig, name: str = "", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.name = name  # for the log: the replica's opaque id
        self._clock = clock
        self._answers: deque[tuple[float, bool]] = deque()  # (when, failed)
        # The failures among _answers, kept as they come and go: a busy replica's window holds
        # tens of thousands of answers, and recounting them on every answer made each request's
        # cost grow with the gateway's rate.
        self._failures = 0
        self._opened_until = 0.0
        self._tripped = False
        self._trial_out = False

    @property
    def state(self) -> State:
        if not self._tripped:
            return State.CLOSED
        return State.OPEN if self._clock() < self._opened_until else State.HALF_OPEN

    def available(self) -> bool:
        """Whether a request may go to the replica now (without claiming the half-open trial)."""
        state = self.state
        return state is State.CLOSED or (state is State.HALF_OPEN and not self._trial_out)

    def claim(self) -> bool:
        """Take the replica for one request; in half-open, this is the one trial."""
        if not self.available():
            return False
        if self.state is State.HALF_OPEN:
            self._trial_out = True
        return True

    def retry_after_s(self) -> float:
        """Seconds until the replica takes a request again (0 when it does now)."""
        if self.available():
            return 0.0
        return max(0.0, self._opened_until - self._clock())

    def record(self, status: int | None) -> None:
        """The outcome of a claimed request: an HTTP status, 0 for a connection that failed, or
        None for no verdict (the client left first)."""
        trial, self._trial_out = self._trial_out, False
        if status is None or status in NEUTRAL:
            return
        failed = status == 0 or status in FAILURES
        now = self._clock()
        if trial:
            if failed:
                self._open(now, "its trial request failed")
            else:
                self._close()
            return
        if self._tripped:
            return  # sent before the trip: only the trial decides
        self._answers.append((now, failed))
        self._failures += failed
        while self._answers and self._answers[0][0] <= now - self.config.window_s:
            self._failures -= self._answers.popleft()[1]
        total = len(self._answers)
        errors = self._failures
        if total >= self.config.min_requests and errors / total > self.config.error_rate:
            self._open(now, f"{errors} of its last {total} answers failed")

    def _open(self, now: float, why: str) -> None:
        self._tripped = True
        self._opened_until = now + self.config.cool_off_s
        self._answers.clear()
        self._failures = 0
        log.warning(
            "replica out of rotation",
            extra={
                "event": "breaker_open",
                "replica": self.name,
                "why": why,
                "cool_off_s": self.config.cool_off_s,
            },
        )

    def _close(self) -> None:
        self._tripped = False
        self._answers.clear()
        self._failures = 0
        log.info("replica back in rotation", extra={"event": "breaker_closed", "replica": self.name})
