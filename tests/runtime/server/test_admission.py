"""Admission control: engine slots, a bounded FIFO queue, fast refusal and queue timeouts."""

from __future__ import annotations

import asyncio

import pytest
from frontier_runtime.server.admission import Admission, QueueFull, QueueTimeout, TicketState


def test_free_slots_admit_at_once() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=2, queue_max_length=1, queue_timeout_s=1)
        a, b = admission.try_enter(), admission.try_enter()
        assert a.state is b.state is TicketState.ADMITTED
        assert await a.wait() and admission.running == 2

    asyncio.run(scenario())


def test_a_full_queue_refuses_without_waiting() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=2, queue_timeout_s=10)
        admission.try_enter()
        admission.try_enter()
        admission.try_enter()
        with pytest.raises(QueueFull, match="1 requests running and 2 queued"):
            admission.try_enter()

    asyncio.run(scenario())


def test_a_released_slot_goes_to_the_oldest_waiter() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=2, queue_timeout_s=10)
        running = admission.try_enter()
        first, second = admission.try_enter(), admission.try_enter()
        running.release()
        assert first.state is TicketState.ADMITTED and second.state is TicketState.QUEUED
        assert await first.wait()
        assert admission.running == 1 and admission.waiting == 1

    asyncio.run(scenario())


def test_a_waiter_times_out_and_never_runs() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=1, queue_timeout_s=0.05)
        running = admission.try_enter()
        queued = admission.try_enter()
        with pytest.raises(QueueTimeout):
            await queued.wait()
        assert admission.waiting == 0
        running.release()
        assert queued.state is TicketState.RELEASED and admission.running == 0

    asyncio.run(scenario())


def test_an_expired_waiter_is_skipped_when_a_slot_frees() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=2, queue_timeout_s=0.05)
        running = admission.try_enter()
        stale = admission.try_enter()
        await asyncio.sleep(0.06)
        running.release()  # the stale waiter has not woken up yet: it must not be started late
        assert stale.state is TicketState.RELEASED and admission.running == 0
        with pytest.raises(QueueTimeout):
            await stale.wait()

    asyncio.run(scenario())


def test_a_partial_wait_keeps_the_queue_place() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=1, queue_timeout_s=10)
        running = admission.try_enter()
        queued = admission.try_enter()
        assert await queued.wait(at_most=0.01) is False
        assert admission.waiting == 1
        running.release()
        assert await queued.wait(at_most=0.01) is True

    asyncio.run(scenario())


def test_leaving_the_queue_frees_the_place_and_release_is_idempotent() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=1, queue_timeout_s=10)
        running = admission.try_enter()
        queued = admission.try_enter()
        queued.release()
        queued.release()
        assert admission.waiting == 0
        admission.try_enter().release()
        running.release()
        running.release()
        assert admission.running == 0

    asyncio.run(scenario())


def test_retry_after_is_a_positive_whole_number_of_seconds() -> None:
    assert Admission(1, 1, 0.1).retry_after_s() == 1
    assert Admission(1, 1, 30).retry_after_s() == 15


def test_a_timer_that_fires_early_never_lets_a_waiter_through(monkeypatch: pytest.MonkeyPatch) -> None:
    import frontier_runtime.server.admission as admission_module

    real_wait_for = asyncio.wait_for

    async def early_wait_for(awaitable, timeout):  # wakes at half the time asked for
        try:
            return await real_wait_for(awaitable, timeout / 2)
        except TimeoutError:
            raise TimeoutError from None

    monkeypatch.setattr(admission_module.asyncio, "wait_for", early_wait_for)

    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=1, queue_timeout_s=0.05)
        admission.try_enter()
        queued = admission.try_enter()
        with pytest.raises(QueueTimeout):
            await queued.wait()
        assert queued.queue_seconds >= 0.05

    asyncio.run(scenario())
