"""Admission by priority class: interactive never waits behind batch work; batch has its own queue."""

from __future__ import annotations

import asyncio

import pytest
from frontier_hostside.names import BATCH
from frontier_runtime.server.admission import Admission, QueueFull, QueueTimeout, TicketState


def test_interactive_requests_are_admitted_even_while_batch_work_holds_every_slot() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=2, queue_max_length=4, queue_timeout_s=5)
        batch = [admission.try_enter(BATCH), admission.try_enter(BATCH)]
        assert all(t.state is TicketState.ADMITTED for t in batch)
        # Batch work only fills what interactive work leaves free: a third batch request queues...
        assert admission.try_enter(BATCH).state is TicketState.QUEUED
        # ...but interactive ones count only against each other, and the engine preempts batch for them.
        chat = [admission.try_enter(), admission.try_enter()]
        assert all(t.state is TicketState.ADMITTED for t in chat)
        assert admission.try_enter().state is TicketState.QUEUED
        assert (admission.running, admission.running_batch, admission.waiting) == (4, 2, 2)

    asyncio.run(scenario())


def test_a_freed_slot_goes_to_queued_interactive_work_before_batch_work() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=1, queue_max_length=4, queue_timeout_s=5)
        running = admission.try_enter()
        queued_batch = admission.try_enter(BATCH)
        queued_chat = admission.try_enter()
        running.release()
        assert queued_chat.state is TicketState.ADMITTED
        assert queued_batch.state is TicketState.QUEUED
        queued_chat.release()
        assert queued_batch.state is TicketState.ADMITTED and admission.running_batch == 1

    asyncio.run(scenario())


def test_batch_work_has_its_own_queue_length_and_timeout() -> None:
    async def scenario() -> None:
        admission = Admission(
            max_concurrency=1,
            queue_max_length=8,
            queue_timeout_s=5,
            batch_queue_max_length=1,
            batch_queue_timeout_s=0.05,
        )
        admission.try_enter()
        waiting = admission.try_enter(BATCH)
        with pytest.raises(QueueFull, match="1 batch requests queued .*1 for batch"):
            admission.try_enter(BATCH)
        # The interactive queue is untouched by the full batch queue.
        assert admission.try_enter().state is TicketState.QUEUED
        with pytest.raises(QueueTimeout):
            await waiting.wait()
        assert admission.waiting_batch == 0

    asyncio.run(scenario())


def test_batch_is_not_admitted_while_interactive_work_waits() -> None:
    async def scenario() -> None:
        admission = Admission(max_concurrency=2, queue_max_length=4, queue_timeout_s=5)
        a, b = admission.try_enter(), admission.try_enter()
        admission.try_enter()  # queued interactive
        a.release()  # the queued interactive takes the slot
        b.release()  # one slot free, no interactive queued
        assert admission.try_enter(BATCH).state is TicketState.ADMITTED

    asyncio.run(scenario())
