"""The prefix cache's changes on the wire, in vLLM's KV-event format, for KV-aware routers.

The block manager records what enters and leaves its prefix cache (``KvEventLog``); after each
engine step with changes the engine hands them to ``KvEventPublisher`` as one batch. A router (the
gateway's ``kv_index``, llm-d's indexer, Dynamo's KV router) keeps hash -> replica from them.

Wire format, as vLLM's ``vllm/distributed/kv_events.py`` lays it out, so a consumer of vLLM's
events reads ours unchanged (and the gateway reads vLLM's):

- PUB socket, one multipart message per batch: ``topic`` (utf-8), the batch's sequence number
  (8 bytes, big-endian, from 0), the msgpack payload.
- The payload is a ``KVEventBatch`` as msgspec encodes vLLM's array-like structs: the array
  ``[ts, events, data_parallel_rank]``, each event an array whose first item is its tag (the class
  name) followed by its fields in declaration order:
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]``,
  ``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``.
- ROUTER socket for replays: a client (REQ or DEALER) sends ``[b"", start_seq]`` (8 bytes big-endian);
  it gets back, for every buffered batch from ``start_seq`` on, ``[b"", seq, payload]`` and then
  ``[b"", -1 (8 bytes, signed), b""]`` to end the replay.

Block hashes are the block manager's own chained hashes (``hash((parent_hash, token_ids))``, Python's
64-bit tuple hash, which depends on no seed for ints), so a router recomputes them from a request's
token ids exactly as the runtime does. The sockets live on the publisher's own thread: ZMQ sockets
belong to one thread, and the engine's step only enqueues.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("frontier_runtime.kv_events")

MEDIUM_GPU = "GPU"  # vLLM's name of the device tier; the runtime's KV cache is always on its device
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


def block_hashes(token_ids: list[int], block_size: int, limit: int | None = None) -> list[int]:
    """The chained hashes of the full blocks of ``token_ids``, as the block manager registers them
    (at most ``limit`` blocks)."""
    hashes: list[int] = []
    parent: int | None = None
    full = len(token_ids) // block_size if limit is None else min(limit, len(token_ids) // block_size)
    for i in range(full):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        hashes.append(parent)
    return hashes


@dataclass
class KvEventLog:
    """Changes to the prefix cache since the last ``take``, as wire-ready event arrays.

    Consecutive blocks of one sequence stored in one call form one ``BlockStored`` (its parent is
    the first block's parent), as vLLM batches them; removals in a row form one ``BlockRemoved``.
    """

    block_size: int
    events: list[list[Any]] = field(default_factory=list)

    def stored(self, parent: int | None, hashes: list[int], token_ids: list[int]) -> None:
        if hashes:
            self.events.append(
                ["BlockStored", hashes, parent, token_ids, self.block_size, None, MEDIUM_GPU, None]
            )

    def removed(self, block_hash: int) -> None:
        last = self.events[-1] if self.events else None
        if last is not None and last[0] == "BlockRemoved":
            last[1].append(block_hash)
        else:
            self.events.append(["BlockRemoved", [block_hash], MEDIUM_GPU])

    def cleared(self) -> None:
        self.events.append(["AllBlocksCleared"])

    def take(self) -> list[list[Any]]:
        events, self.events = self.events, []
        return events


def encode_batch(events: list[list[Any]], ts: float | None = None, data_parallel_rank: int = 0) -> bytes:
    """One ``KVEventBatch`` payload: ``[ts, events, data_parallel_rank]`` in msgpack."""
    import msgpack  # type: ignore[import-untyped]

    payload: bytes = msgpack.packb([time.time() if ts is None else ts, events, data_parallel_rank])
    return payload


class KvEventPublisher:
    """PUB + replay ROUTER on a thread of their own; ``publish`` only enqueues (never blocks a step)."""

    def __init__(
        self,
        port: int,
        replay_port: int,
        topic: str = "",
        buffer_steps: int = 10_000,
        host: str = "*",
        data_parallel_rank: int = 0,
        max_queue: int = 100_000,
    ) -> None:
        import zmq

        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._queue: queue.Queue[list[list[Any]]] = queue.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self.dropped = 0  # batches refused because the queue was full (the subscribers see a gap)
        self._lost = 0  # of which not yet skipped in the sequence
        self._lock = threading.Lock()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._replay = self._ctx.socket(zmq.ROUTER)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay.setsockopt(zmq.LINGER, 0)
        try:
            self._pub.bind(f"tcp://{host}:{port}")
            self._replay.bind(f"tcp://{host}:{replay_port}")
        except zmq.ZMQError as exc:
            self._pub.close()
            self._replay.close()
            self._ctx.term()
            raise OSError(f"KV events: cannot bind ports {port}/{replay_port}: {exc}") from exc
        # The sockets move to the publisher thread from here on (ZMQ: one thread per socket).
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[list[Any]]) -> None:
        if not events or not self._running:
            return
        try:
            self._queue.put_nowait(events)
        except queue.Full:
            # Dropping keeps the step moving; the sequence still advances so subscribers see the gap
            # and resync (replay cannot return what was never buffered: they drop this replica's entries).
            with self._lock:
                self.dropped += 1
                self._lost += 1

    def close(self, timeout_s: float = 1.0) -> None:
        if not self._running:
            return
        self._running = False
        self._thread.join(timeout=timeout_s)
        self._pub.close(linger=0)
        self._replay.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._replay, zmq.POLLIN)
        while self._running or not self._queue.empty():
            if dict(poller.poll(0)).get(self._replay):
                try:
                    self._serve_replay()
                except zmq.ZMQError:
                    log.exception("KV events: a replay failed")
            try:
                events = self._queue.get(timeout=0.02)
            except queue.Empty:
                continue
            with self._lock:
                self._next_seq += self._lost
                self._lost = 0
            seq = self._next_seq
            self._next_seq += 1
            payload = encode_batch(events, data_parallel_rank=self.data_parallel_rank)
            self._buffer.append((seq, payload))
            try:
                self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError:
                log.exception("KV events: a publish failed")

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("KV events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_OF_REPLAY, b""))
