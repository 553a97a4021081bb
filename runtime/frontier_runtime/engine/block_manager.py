"""Paged KV cache bookkeeping: fixed-size blocks, reference counts, prefix caching.

A block holds the K/V of ``block_size`` consecutive tokens of one or more sequences (shared when
their prefixes are equal). Once a block is full and computed it is registered under a chained hash
of (hash of the previous block, its token ids), so a later sequence with the same prefix reuses it.
Freed blocks keep their content and hash and sit in an LRU free list: they are reusable by a
prefix hit until the allocator evicts them for new content.

Under a sliding window on every layer (``window`` > 0), a sequence's leading blocks that no later
query of it can see are freed as it moves on (``release_behind_window``), so a long sequence holds
about ``window / block_size`` blocks: its table keeps their stale cells, to which attention gives
no weight (the kernels start at the window, the gather path masks them), and
``num_released_blocks`` counts them.

Every sequence holding blocks also holds a row of the device-side block table (``row_of``).
Each change to a sequence's block list is logged as a ``(row, column, block)`` triple
(``take_table_updates``): the model runner applies only those to its table tensor each step
instead of rebuilding every table from Python lists, and sends them to the other
tensor-parallel ranks, which keep identical tables.

With KV events on (``events``), every hash that enters or leaves ``cached`` is logged for the
publisher (``kv_events.py``): the events mirror exactly what ``find_cached_prefix`` can find.
"""

from __future__ import annotations

from collections import OrderedDict

from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.kv_events import KvEventLog
from frontier_runtime.engine.sequence import Sequence


class BlockManager:
    def __init__(self, config: EngineConfig, num_blocks: int, window: int = 0) -> None:
        """``window``: the sliding window every layer attends within (0: some layer sees it all)."""
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        if window < 0:
            raise ValueError(f"the sliding window must be >= 0 tokens (0: none), got {window}")
        self.window = window
        self.num_blocks = num_blocks
        self.block_size = config.block_size
        self.enable_prefix_caching = config.prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # chained hash -> block id
        self.row_of: dict[Sequence, int] = {}  # block-table row of each sequence holding blocks
        self.free_rows: list[int] = []
        self.num_rows = 0
        self.updates: dict[tuple[int, int], int] = {}  # (row, column) -> block, since the last take
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found
        # What enters and leaves ``cached``, for the KV-event publisher (None: kv_events off).
        self.events: KvEventLog | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ---------------------------------------------------------------------------

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of ``seq``, at most ``num_tokens - 1`` tokens.

        The cap keeps at least one token to compute, which produces the logits to sample from.
        """
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        found: list[int] = []
        parent: int | None = None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = hash((parent, tokens))
            block = self.cached.get(h)
            if block is None or self.block_tokens[block] != tokens:
                break
            found.append(block)
            parent = h
        return found

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the sequence's newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        events = self.events
        run: list[int] = []  # hashes new to the cache, consecutive: one BlockStored event
        run_parent: int | None = None
        for i in range(seq.num_hashed_blocks, full):
            block = seq.block_table[i]
            if self.block_hash[block] is None:
                parent = self.block_hash[seq.block_table[i - 1]] if i else None
                tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                h = hash((parent, tokens))
                self.block_hash[block] = h
                self.block_tokens[block] = tokens
                if events is not None and h not in self.cached:
                    if not run:
                        run_parent = parent
                    run.append(h)
                    self.cached[h] = block
                    continue
                self.cached.setdefault(h, block)
            if run:
                self._stored(run_parent, run, seq, i - len(run))
                run = []
        if run:
            self._stored(run_parent, run, seq, full - len(run))
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, full)

    def _stored(self, parent: int | None, hashes: list[int], seq: Sequence, first: int) -> None:
        assert self.events is not None
        bs = self.block_size
        self.events.stored(parent, hashes, list(seq.token_ids[first * bs : (first + len(hashes)) * bs]))

    # -- allocation -----------------------------------------------------------------------------

    def can_admit(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> bool:
        needed = self.blocks_for(len(cached) * self.block_size + num_new_tokens) - len(cached)
        revived = sum(1 for b in cached if self.ref_counts[b] == 0)  # leave the free list when taken
        return needed + revived <= len(self.free)

    def admit(self, seq: Sequence, cached: list[int], num_new_tokens: int) -> None:
        """Give a waiting sequence its cached prefix blocks plus room for ``num_new_tokens``."""
        for b in cached:
            if self.ref_counts[b] == 0:
                del self.free[b]
            self.ref_counts[b] += 1
        seq.block_table = list(cached)
        seq.num_released_blocks = 0
        row = self._row(seq)
        for col, b in enumerate(cached):
            self.updates[(row, col)] = b
        seq.num_hashed_blocks = len(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        if seq.num_cached_prompt_tokens == 0 and seq.num_output_tokens == 0:
            seq.num_cached_prompt_tokens = seq.num_computed_tokens
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += seq.num_computed_tokens
        self.append_slots(seq, num_new_tokens)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table) <= len(
            self.free
        )

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if needed > len(self.free):
            raise RuntimeError(f"out of KV blocks: {needed} needed, {len(self.free)} free")
        if needed <= 0:
            return
        row = self._row(seq)
        for _ in range(needed):
            self.updates[(row, len(seq.block_table))] = block = self._take_free_block()
            seq.block_table.append(block)

    def _row(self, seq: Sequence) -> int:
        row = self.row_of.get(seq)
        if row is None:
            if self.free_rows:
                row = self.free_rows.pop()
            else:
                row, self.num_rows = self.num_rows, self.num_rows + 1
            self.row_of[seq] = row
        return row

    def row(self, seq: Sequence) -> int:
        """The block-table row of a sequence that holds blocks."""
        return self.row_of[seq]

    def take_table_updates(self) -> list[int]:
        """The table cells changed since the last call, flat ``row, column, block`` triples."""
        flat = [x for (row, col), block in self.updates.items() for x in (row, col, block)]
        self.updates.clear()
        return flat

    def _take_free_block(self) -> int:
        block, _ = self.free.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:  # evict its old content from the prefix cache
            if self.cached.get(h) == block:
                del self.cached[h]
                if self.events is not None:
                    self.events.removed(h)
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    def release_behind_window(self, seq: Sequence) -> None:
        """Free the leading blocks no later query of ``seq`` sees (every layer sliding).

        The next query sits at ``num_computed_tokens`` and reads keys from ``num_computed_tokens -
        window + 1`` on; later ones start later still. With prefix caching the block before the
        first unhashed one is kept: its hash chains the next block's registration.
        """
        if not self.window:
            return
        behind = (seq.num_computed_tokens - self.window + 1) // self.block_size
        if self.enable_prefix_caching:
            behind = min(behind, seq.num_hashed_blocks - 1)
        for i in range(seq.num_released_blocks, behind):
            self._unreference(seq.block_table[i])
        seq.num_released_blocks = max(seq.num_released_blocks, behind)

    def release(self, seq: Sequence) -> None:
        """Drop the sequence's references; blocks nobody uses go back to the free list.

        The tail blocks are freed first so they are evicted first: a prefix outlives its suffixes.
        """
        for block in reversed(seq.block_table[seq.num_released_blocks :]):
            self._unreference(block)
        seq.block_table = []
        seq.num_released_blocks = 0
        row = self.row_of.pop(seq, None)
        if row is not None:
            self.free_rows.append(row)
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0

    def _unreference(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free[block] = None
            if self.block_hash[block] is None:
                self.free.move_to_end(block, last=False)  # no content worth keeping: reuse first

    # -- leases and pulls (kv_transfer.py) ------------------------------------------------------

    def hold(self, blocks: list[int]) -> None:
        """One more reference to each block (a prefill's lease, a pull's hits): none is evicted."""
        for b in blocks:
            if self.ref_counts[b] == 0:
                del self.free[b]
            self.ref_counts[b] += 1

    def unhold(self, blocks: list[int]) -> None:
        """Drop what ``hold`` or ``reserve`` took; the last blocks are freed first (evicted first)."""
        for b in reversed(blocks):
            self._unreference(b)

    def reserve(self, n: int) -> list[int] | None:
        """``n`` free blocks for content arriving from elsewhere (a pull), or None if fewer are free."""
        if n > len(self.free):
            return None
        return [self._take_free_block() for _ in range(n)]

    def register(self, token_ids: list[int], blocks: list[int]) -> None:
        """Enter full blocks holding ``token_ids``' leading tokens, in order, into the prefix cache
        (pulled blocks: a later request with the same prefix finds them)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent: int | None = None
        run: list[int] = []
        run_parent: int | None = None
        first = 0
        for i, block in enumerate(blocks):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = hash((parent, tokens))
            if self.block_hash[block] is None:
                self.block_hash[block] = h
                self.block_tokens[block] = tokens
                if h not in self.cached:
                    self.cached[h] = block
                    if self.events is not None:
                        if not run:
                            run_parent, first = parent, i
                        run.append(h)
                        parent = h
                        continue
            if run and self.events is not None:
                self.events.stored(run_parent, run, list(token_ids[first * bs : (first + len(run)) * bs]))
                run = []
            parent = h
        if run and self.events is not None:
            self.events.stored(run_parent, run, list(token_ids[first * bs : (first + len(run)) * bs]))
