"""Holding requests for a pool with no ready replica, while one starts (scale from zero).

A pool that may scale to zero (``min_size: 0``) has a hold queue (the stack's ``gateway.hold``):
a request that finds no available replica waits in it instead of getting a 503 at once. The queue
is bounded in length (``max_requests``: one more is refused at once) and in time (``timeout_s``:
past it, a 503). Both 503s carry ``Retry-After``. A generation whose replica died with no other
ready waits here too, to continue where it stopped (``migration.py``).

The queue is the pool's demand signal: its length is the gauge ``frontier_gateway_pool_waiting
{pool}``, which the local autoscaler scrapes from the admin port, Prometheus (and KEDA's trigger)
reads on Kubernetes, and the gateway's host publishes to CloudWatch on EC2. A pool at zero with a
request waiting launches one replica.

Waiters leave in priority order (interactive before batch), first come first served within a
class, as soon as the prober finds a replica ready (:meth:`HoldQueue.release`). A client that
disconnects while held leaves the queue at once, so its place goes to the next request.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from frontier_hostside.names import PRIORITY_CLASSES

from frontier_gateway.config import HoldConfig
from frontier_gateway.errors import GatewayError

# The demand signal: requests held per pool, waiting for a replica to become ready.
POOL_WAITING_METRIC = "frontier_gateway_pool_waiting"
POOL_LABEL = "pool"
# The same signal in CloudWatch (the runtime's namespace, dimensions Stack and NodeGroup of the
# pool's node group): what the EC2 group's from-zero alarm reads.
HELD_REQUESTS_CW_METRIC = "HeldRequests"


class ClientLeft(Exception):
    """The client disconnected while its request was held."""


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    released: asyncio.Future[None] = field(compare=False)


class HoldQueue:
    """The bounded, priority-ordered queue of one pool's held requests."""

    def __init__(self, pool: str, config: HoldConfig) -> None:
        self.pool = pool
        self.config = config
        self._heap: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(not w.released.done() for w in self._heap)

    async def wait(
        self,
        priority: str,
        available: Callable[[], bool],
        until_disconnect: Callable[[], Awaitable[object]] | None = None,
    ) -> float:
        """Return once ``available()`` (seconds held); raise the 503 when the queue is full or the
        timeout passes, :class:`ClientLeft` when the client goes first."""
        started = time.monotonic()
        if self.waiting >= self.config.max_requests:
            raise self._refusal(
                f"{self.waiting} requests already wait for a replica of model {self.pool!r} to start "
                f"(gateway.hold.{self.pool}.max_requests = {self.config.max_requests})",
                code="hold_queue_full",
            )
        deadline = started + self.config.timeout_s
        # One place in line for the whole wait: woken for a replica that went again, it keeps it.
        place = (PRIORITY_CLASSES.index(priority), next(self._seq))
        watcher = asyncio.ensure_future(until_disconnect()) if until_disconnect is not None else None
        try:
            # A replica may be ready, then gone before this request's turn: wait again until the deadline.
            while not available():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._refusal(
                        f"no replica of model {self.pool!r} became ready within {self.config.timeout_s:g} s "
                        f"(gateway.hold.{self.pool}.timeout_s)",
                        code="hold_timeout",
                    )
                await self._one_turn(place, left, watcher)
        finally:
            if watcher is not None:
                watcher.cancel()
        return time.monotonic() - started

    async def _one_turn(
        self, place: tuple[int, int], left: float, watcher: asyncio.Future[Any] | None
    ) -> None:
        waiter = _Waiter(*place, asyncio.get_running_loop().create_future())
        heapq.heappush(self._heap, waiter)
        try:
            pending = {waiter.released} if watcher is None else {waiter.released, watcher}
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if watcher is not None and watcher.done() and not waiter.released.done():
                raise ClientLeft
        finally:
            if not waiter.released.done():
                waiter.released.cancel()
            self._heap = [w for w in self._heap if w is not waiter]
            heapq.heapify(self._heap)

    def release(self) -> int:
        """Wake every waiter, interactive first, then in arrival order; how many were woken."""
        woken = 0
        for waiter in sorted(self._heap):
            if not waiter.released.done():
                waiter.released.set_result(None)
                woken += 1
        return woken

    def _refusal(self, why: str, *, code: str) -> GatewayError:
        # A replica starting from zero takes about the hold timeout: come back after a part of it.
        retry = max(1, math.ceil(min(self.config.timeout_s, 30.0)))
        return GatewayError(
            503,
            f"{why}; retry in {retry} s.",
            code=code,
            headers={"Retry-After": str(retry)},
        )
