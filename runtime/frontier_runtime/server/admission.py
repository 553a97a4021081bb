"""Admission control: at most ``max_concurrency`` requests in the engine, a bounded FIFO queue
per priority class.

A request asks for a ticket before anything costly happens (no tokenisation, no engine work):

* a free engine slot and nobody queued → admitted at once;
* otherwise a free queue place → queued (first come, first served);
* otherwise → ``QueueFull`` at once (answered 429 with Retry-After).

A queued ticket that is not admitted within the queue timeout raises ``QueueTimeout`` (answered
503) and never reaches the engine. ``release`` frees whatever the ticket holds — a queue place or
an engine slot — and hands a freed slot to the oldest waiter, so a client that leaves while
queued costs nothing further.

Priority: interactive requests count only against each other, so batch work never holds a slot
an interactive request is waiting for (the engine's scheduler runs interactive sequences first
and preempts batch ones to make room). Batch requests are admitted only while the engine holds
fewer than ``max_concurrency`` requests of either class and no interactive request is queued,
and wait in their own queue with its own length and timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from contextlib import suppress
from enum import Enum

from frontier_hostside.names import BATCH, INTERACTIVE


class QueueFull(Exception):
    """No engine slot and no queue place: the request is refused without being started."""


class QueueTimeout(Exception):
    """The request waited longer than the queue timeout and was dropped without being started."""


class TicketState(Enum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    RELEASED = "released"


class Ticket:
    def __init__(self, admission: Admission, state: TicketState, priority: str = INTERACTIVE) -> None:
        self._admission = admission
        self.priority = priority
        self.state = state
        self.enqueued_at = time.monotonic()
        self.admitted_at: float | None = self.enqueued_at if state is TicketState.ADMITTED else None
        self._admitted = asyncio.Event()
        if state is TicketState.ADMITTED:
            self._admitted.set()

    @property
    def queue_seconds(self) -> float:
        end = self.admitted_at if self.admitted_at is not None else time.monotonic()
        return end - self.enqueued_at

    @property
    def deadline(self) -> float:
        return self.enqueued_at + self._admission.timeout_for(self.priority)

    async def wait(self, at_most: float | None = None) -> bool:
        """Wait for admission: True once admitted, False if still queued after ``at_most`` seconds.

        Raises ``QueueTimeout`` (and gives the queue place up) once the queue timeout has passed.
        """
        give_up_at = None if at_most is None else time.monotonic() + at_most
        while True:
            if self.state is TicketState.ADMITTED:
                return True
            now = time.monotonic()
            if self.state is TicketState.RELEASED or now >= self.deadline:
                self.release()
                raise QueueTimeout(f"waited {self.queue_seconds * 1000:.0f} ms for admission")
            if give_up_at is not None and now >= give_up_at:
                return False
            # Timers may fire a hair early: the loop re-checks the clock rather than trusting them.
            budget = self.deadline - now if give_up_at is None else min(self.deadline, give_up_at) - now
            with suppress(TimeoutError):
                await asyncio.wait_for(self._admitted.wait(), timeout=budget)

    def release(self) -> None:
        """Give back the queue place or engine slot; idempotent."""
        self._admission._release(self)

    def _admit(self) -> None:
        self.state = TicketState.ADMITTED
        self.admitted_at = time.monotonic()
        self._admitted.set()


class Admission:
    def __init__(
        self,
        max_concurrency: int,
        queue_max_length: int,
        queue_timeout_s: float,
        *,
        batch_queue_max_length: int | None = None,
        batch_queue_timeout_s: float | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.queue_max_length = queue_max_length
        self.queue_timeout_s = queue_timeout_s
        self.batch_queue_max_length = (
            queue_max_length if batch_queue_max_length is None else batch_queue_max_length
        )
        self.batch_queue_timeout_s = (
            queue_timeout_s if batch_queue_timeout_s is None else batch_queue_timeout_s
        )
        self.running = 0
        self.running_batch = 0
        self._queue: deque[Ticket] = deque()
        self._batch_queue: deque[Ticket] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue) + len(self._batch_queue)

    @property
    def waiting_batch(self) -> int:
        return len(self._batch_queue)

    def timeout_for(self, priority: str) -> float:
        return self.batch_queue_timeout_s if priority == BATCH else self.queue_timeout_s

    def try_enter(self, priority: str = INTERACTIVE) -> Ticket:
        """A ticket, admitted or queued; ``QueueFull`` when neither is possible. Never blocks."""
        if priority == BATCH:
            return self._try_enter_batch()
        if self.running - self.running_batch < self.max_concurrency and not self._queue:
            self.running += 1
            return Ticket(self, TicketState.ADMITTED)
        if len(self._queue) >= self.queue_max_length:
            raise QueueFull(
                f"{self.running} requests running and {len(self._queue)} queued (limits {self.max_concurrency} "
                f"and {self.queue_max_length})"
            )
        ticket = Ticket(self, TicketState.QUEUED)
        self._queue.append(ticket)
        return ticket

    def _batch_may_start(self) -> bool:
        return self.running < self.max_concurrency and not self._queue

    def _try_enter_batch(self) -> Ticket:
        if self._batch_may_start() and not self._batch_queue:
            self.running += 1
            self.running_batch += 1
            return Ticket(self, TicketState.ADMITTED, BATCH)
        if len(self._batch_queue) >= self.batch_queue_max_length:
            raise QueueFull(
                f"{self.running} requests running and {len(self._batch_queue)} batch requests queued (limits "
                f"{self.max_concurrency} and {self.batch_queue_max_length} for batch)"
            )
        ticket = Ticket(self, TicketState.QUEUED, BATCH)
        self._batch_queue.append(ticket)
        return ticket

    def retry_after_s(self) -> int:
        """A hint for Retry-After: roughly how long the queue takes to turn over, at least 1 s."""
        return max(1, min(60, round(self.queue_timeout_s / 2)))

    def _release(self, ticket: Ticket) -> None:
        if ticket.state is TicketState.QUEUED:
            (self._batch_queue if ticket.priority == BATCH else self._queue).remove(ticket)
        elif ticket.state is TicketState.ADMITTED:
            self.running -= 1
            self.running_batch -= ticket.priority == BATCH
            self._admit_next()
        ticket.state = TicketState.RELEASED

    def _admit_next(self) -> None:
        now = time.monotonic()
        # Interactive first; batch only on what interactive leaves free.
        while self._queue and self.running - self.running_batch < self.max_concurrency:
            self._admit_first(self._queue, now)
        while self._batch_queue and self._batch_may_start():
            self._admit_first(self._batch_queue, now)

    def _admit_first(self, queue: deque[Ticket], now: float) -> None:
        """Admit the ticket at the head of ``queue``, or release it if its deadline has passed."""
        nxt = queue.popleft()
        if now >= nxt.deadline:
            # Expired while its waiter had not yet woken: it must not start late.
            nxt.state = TicketState.RELEASED
            nxt._admitted.set()
            return
        self.running += 1
        self.running_batch += nxt.priority == BATCH
        nxt._admit()
