"""Iteration-level scheduling under one token budget (no separate prefill and decode phases).

Each step every scheduled sequence moves its computed-token count toward its total: a decode
moves by one, a prompt by as much as the budget allows (chunked prefill), so long prompts share
steps with decodes instead of stalling them. Running sequences go first, in arrival order; then
waiting ones are admitted FCFS while the budget, ``max_batch_size`` and free blocks allow. When
blocks run out, the newest running sequence is preempted: its blocks are freed and it returns to
the head of the queue to be recomputed later (its prefix may still be in the cache).

Priority classes: interactive sequences queue ahead of batch ones and run first within a step, so
batch work gets only the budget, batch slots and blocks interactive work leaves free. Batch
sequences are the first preempted under block pressure, an interactive sequence waiting for a
slot or blocks preempts the newest batch ones to get them, and batch sequences skip the steps in
which an interactive prompt waits or is prefilled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from frontier_hostside.names import BATCH

from frontier_runtime.engine.block_manager import BlockManager
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.sequence import Sequence, Status

# Batch sequences share at most 1/BATCH_SHARE of a step's token budget (at least one decode each).
BATCH_SHARE = 8


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens)
    finished: list[Sequence] = field(default_factory=list)  # ended by the scheduler (can never fit)
    num_preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.blocks = block_manager
        self.max_batch_size = config.max_batch_size
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._held = 0  # running sequences left out of this schedule (their step is in flight)
        # Running sequences admitted with their prompt (or recomputation) not yet all computed. A
        # running sequence only leaves this state (each step computes what the last appended), so
        # the check for a pending interactive prefill looks at these, not at every running one.
        self._prefilling: set[Sequence] = set()
        self._busy: Collection[Sequence] = ()  # this schedule's in-flight sequences (see schedule)

    def add(self, seq: Sequence) -> None:
        if _is_batch(seq):
            self.waiting.append(seq)
        else:
            self.waiting.insert(self._first_waiting_batch(), seq)

    def _first_waiting_batch(self) -> int:
        for i, seq in enumerate(self.waiting):
            if _is_batch(seq):
                return i
        return len(self.waiting)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues (finished or aborted) and free its blocks."""
        self._prefilling.discard(seq)
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)

    def _never_fits(self, num_tokens: int) -> bool:
        return self.blocks.blocks_for(num_tokens) > self.blocks.num_blocks

    def _finish_unfittable(self, seq: Sequence, out: SchedulerOutput) -> None:
        self._prefilling.discard(seq)
        self.blocks.release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = "length"
        out.finished.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        self._prefilling.discard(seq)
        self.blocks.release(seq)
        seq.status = Status.WAITING
        if _is_batch(seq):
            self.waiting.insert(self._first_waiting_batch(), seq)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _interactive_prefill_pending(self) -> bool:
        if self.waiting and not _is_batch(self.waiting[0]):
            return True
        done = [
            s
            for s in self._prefilling
            if s.status is not Status.RUNNING or s.num_computed_tokens >= s.num_tokens - 1
        ]
        self._prefilling.difference_update(done)
        return any(not _is_batch(s) and s not in self._busy for s in self._prefilling)

    def _make_room_for_interactive(self, out: SchedulerOutput) -> None:
        """Preempt the newest batch sequences while interactive ones wait for slots or blocks."""
        waiting_interactive = self._first_waiting_batch()
        if not waiting_interactive:
            return
        head = self.waiting[0]
        if self._never_fits(head.num_tokens):
            return  # it will be finished as unfittable; no batch work need make way for it
        while True:
            victim = next((s for s in reversed(self.running) if _is_batch(s)), None)
            if victim is None:
                return
            if (
                len(self.running) + self._held + min(waiting_interactive, self.max_batch_size)
                <= self.max_batch_size
            ):
                cached = self.blocks.find_cached_prefix(head)
                remaining = head.num_tokens - len(cached) * self.blocks.block_size
                if self.blocks.can_admit(head, cached, min(remaining, self.max_num_batched_tokens)):
                    return
            self.running.remove(victim)
            self._preempt(victim)
            out.num_preempted += 1

    def schedule(self, busy: Collection[Sequence] = (), max_seqs: int | None = None) -> SchedulerOutput:
        """The next step. ``busy``: running sequences whose previous step is still in flight (a
        pipeline keeps several steps in flight): not scheduled, never preempted, and they keep their
        slots and blocks. ``max_seqs``: at most this many sequences in the step."""
        if not busy:
            return self._schedule(max_seqs or self.max_batch_size)
        order = {id(seq): i for i, seq in enumerate(self.running)}
        hidden = [seq for seq in self.running if seq in busy]
        self.running = [seq for seq in self.running if seq not in busy]
        self._held = len(hidden)  # their slots count against max_batch_size: every step in flight together
        self._busy = busy
        try:
            return self._schedule(max_seqs or self.max_batch_size)
        finally:
            self._held = 0
            self._busy = ()
            # Back in arrival order (new sequences last), so the newest is still preempted first.
            self.running = sorted(
                self.running + hidden, key=lambda seq: order.get(id(seq), len(order) + seq.arrival)
            )

    def _schedule(self, max_seqs: int) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self._make_room_for_interactive(out)
        # Interactive first (each class oldest first): they get the budget first and the newest
        # batch sequence is the first preempted from the end.
        self.running.sort(key=_is_batch)
        starved = False
        # While an interactive prompt waits or prefills, batch sequences sit the step out: its
        # first token (TTFT) then costs what it would cost without any batch work.
        pause_batch = self._interactive_prefill_pending()
        # Batch work gets a small share of a step's tokens (its decodes always fit), so a step that
        # carries a batch prompt, or one recomputed after preemption, stays short for an
        # interactive request that arrives during it.
        batch_budget = (
            max(self.max_batch_size, self.max_num_batched_tokens // BATCH_SHARE)
            if self.chunked_prefill
            else budget
        )

        # 1. Running sequences, oldest first; make room by preempting from the newest end.
        i = 0
        block_size = self.blocks.block_size
        scheduled = out.scheduled
        while i < len(self.running) and budget > 0 and len(scheduled) < max_seqs:
            seq = self.running[i]
            is_batch = _is_batch(seq)
            if pause_batch and is_batch:
                break  # every later one is batch too (sorted above)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if is_batch:
                num_new = min(num_new, batch_budget)
                if num_new <= 0:
                    break
            if seq.num_computed_tokens + num_new <= len(seq.block_table) * block_size:
                # The common decode: its slot is in a block it holds, so no block is taken.
                scheduled.append((seq, num_new))
                budget -= num_new
                batch_budget -= num_new if is_batch else 0
                i += 1
                continue
            while not self.blocks.can_append(seq, num_new):
                if self.running[-1] is seq and len(self.running) == 1 and self._never_fits(seq.num_tokens):
                    self.running.pop()
                    self._finish_unfittable(seq, out)
                    break
                victim = self.running.pop()
                self._preempt(victim)
                out.num_preempted += 1
                starved = True
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break
            self.blocks.append_slots(seq, num_new)
            out.scheduled.append((seq, num_new))
            budget -= num_new
            batch_budget -= num_new if _is_batch(seq) else 0
            i += 1

        # 2. Waiting sequences, FCFS; none jumps ahead of a head that does not fit.
        while (
            self.waiting
            and budget > 0
            and len(self.running) + self._held < self.max_batch_size
            and len(out.scheduled) < max_seqs
            and not starved
        ):
            seq = self.waiting[0]
            if pause_batch and _is_batch(seq):
                break
            if self._never_fits(seq.num_tokens) or (
                not self.chunked_prefill and seq.num_tokens > self.max_num_batched_tokens
            ):
                self.waiting.popleft()
                self._finish_unfittable(seq, out)
                continue
            cached = self.blocks.find_cached_prefix(seq)
            remaining = seq.num_tokens - len(cached) * self.blocks.block_size
            if not self.chunked_prefill and remaining > budget:
                break
            num_new = min(remaining, budget, batch_budget if _is_batch(seq) else budget)
            if num_new <= 0:
                break
            if not self.blocks.can_admit(seq, cached, num_new):
                break
            self.waiting.popleft()
            self.blocks.admit(seq, cached, num_new)
            seq.status = Status.RUNNING
            self.running.append(seq)
            self._prefilling.add(seq)  # pruned once its prompt is computed
            out.scheduled.append((seq, num_new))
            budget -= num_new
            batch_budget -= num_new if _is_batch(seq) else 0
        return out


def _is_batch(seq: Sequence) -> bool:
    return seq.params.priority == BATCH
