"""KV events: the block manager logs exactly what enters and leaves its prefix cache, and the
publisher puts it on the wire as vLLM does (``vllm/distributed/kv_events.py``), so vLLM's own
msgspec structs decode it and its replay protocol resends it."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq
from frontier_runtime.engine.block_manager import BlockManager
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.detokenizer import IncrementalDetokenizer
from frontier_runtime.engine.kv_events import KvEventLog, KvEventPublisher, block_hashes, encode_batch
from frontier_runtime.engine.sequence import Sequence
from frontier_runtime.requests import SamplingParams

# -- vLLM's layout, declared as vllm/distributed/kv_events.py declares it ----------------------------
# Array-like tagged structs: an event is [tag, *fields in declaration order]; the batch is
# [ts, events, data_parallel_rank]. Fields vLLM added later (lora_name, extra_keys, group_idx, ...)
# come after these, so decoders of either age read the same bytes (msgspec ignores trailing items).


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def _block_manager(num_blocks: int, block_size: int) -> BlockManager:
    bm = BlockManager(EngineConfig(Path("unused"), block_size=block_size), num_blocks)
    bm.events = KvEventLog(block_size)
    return bm


def _seq(tokens: list[int], rid: str) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), 0, IncrementalDetokenizer(None), frozenset())


def _computed(bm: BlockManager, seq: Sequence) -> None:
    cached = bm.find_cached_prefix(seq)
    bm.admit(seq, cached, seq.num_tokens - len(cached) * bm.block_size)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_computed_blocks(seq)


def test_stored_blocks_chain_from_their_parent_with_the_hashes_a_router_recomputes() -> None:
    bm = _block_manager(16, 4)
    a = _seq(list(range(10)), "a")  # two full blocks
    _computed(bm, a)
    b = _seq(list(range(8)) + [70, 71, 72, 73, 74], "b")  # shares both, adds one
    _computed(bm, b)
    events = DECODER.decode(encode_batch(bm.events.take() if bm.events else [])).events
    assert [type(e) for e in events] == [BlockStored, BlockStored]
    first, second = events
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.block_hashes == block_hashes(list(range(10)), 4)
    assert first.parent_block_hash is None and first.token_ids == list(range(8)) and first.block_size == 4
    assert first.medium == "GPU" and first.lora_id is None
    assert second.parent_block_hash == first.block_hashes[-1]
    assert second.block_hashes == block_hashes(b.token_ids, 4)[2:]
    assert second.token_ids == [70, 71, 72, 73]
    # The events name exactly the hashes the cache can find.
    assert set(first.block_hashes + second.block_hashes) == set(bm.cached)


def test_an_evicted_block_is_removed_once_and_a_duplicate_is_never_announced() -> None:
    bm = _block_manager(3, 4)
    a = _seq(list(range(9)), "a")  # 2 full blocks + 1 partial: all three blocks
    _computed(bm, a)
    twin = _seq(list(range(9)), "twin")
    bm.release(a)
    assert bm.events is not None
    stored = bm.events.take()
    _computed(bm, twin)  # reuses one cached block (hit capped at num_tokens - 1), evicts the tail
    events = DECODER.decode(encode_batch(bm.events.take())).events
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    restored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert len(stored) == 1 and stored[0][1] == block_hashes(list(range(9)), 4)
    assert set(removed) <= set(stored[0][1])
    # Whatever went out and came back, the sum of the events equals the cache's content.
    known = (set(stored[0][1]) - set(removed)) | set(restored)
    assert known == set(bm.cached)


def test_all_blocks_cleared_decodes_as_vllms_tag() -> None:
    log = KvEventLog(16)
    log.cleared()
    batch = DECODER.decode(encode_batch(log.take(), ts=12.5, data_parallel_rank=0))
    assert batch.ts == 12.5 and batch.data_parallel_rank == 0
    assert batch.events == [AllBlocksCleared()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_subscribed(pub: KvEventPublisher, sub: zmq.Socket[bytes]) -> list[bytes]:
    """PUB drops what it sends before a subscriber joined: publish probes until one arrives."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.publish([["AllBlocksCleared"]])
        if sub.poll(100):
            return sub.recv_multipart()
    raise AssertionError("no batch reached the subscriber")


def test_the_wire_frames_are_topic_sequence_payload_and_a_replay_resends_from_a_sequence() -> None:
    port, replay_port = _free_port(), _free_port()
    pub = KvEventPublisher(port, replay_port, topic="kv-events", buffer_steps=100, host="127.0.0.1")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    try:
        topic, seq_bytes, _ = _wait_subscribed(pub, sub)
        assert topic == b"kv-events" and len(seq_bytes) == 8
        first = int.from_bytes(seq_bytes, "big")
        for i in range(3):
            pub.publish([["BlockStored", [100 + i], None, [1, 2], 2, None, "GPU", None]])
        got = [sub.recv_multipart() for _ in range(3)]
        seqs = [int.from_bytes(f[1], "big") for f in got]
        assert seqs == [first + 1, first + 2, first + 3]
        decoded = [DECODER.decode(f[2]).events[0] for f in got]
        assert [e.block_hashes for e in decoded if isinstance(e, BlockStored)] == [[100], [101], [102]]

        # vLLM's replay: a REQ-style client sends the start sequence, gets (seq, payload) per buffered
        # batch from there, then (-1, b"").
        req = ctx.socket(zmq.DEALER)
        req.connect(f"tcp://127.0.0.1:{replay_port}")
        req.send_multipart((b"", (first + 2).to_bytes(8, "big")))
        replayed = []
        while True:
            assert req.poll(5000)
            _, seq_b, payload = req.recv_multipart()
            seq = int.from_bytes(seq_b, "big", signed=True)
            if seq == -1:
                assert payload == b""
                break
            replayed.append((seq, DECODER.decode(payload)))
        assert [s for s, _ in replayed] == [first + 2, first + 3]
        assert replayed[0][1].events == [BlockStored([101], None, [1, 2], 2, None, "GPU")]
        req.close(linger=0)
    finally:
        sub.close(linger=0)
        ctx.term()
        pub.close()


def test_an_engine_with_kv_events_on_publishes_its_prompts_blocks(gqa_dir: Path) -> None:
    from frontier_runtime.engine.llm_engine import LLMEngine

    port, replay_port = _free_port(), _free_port()
    settings = {"enabled": True, "port": port, "replay_port": replay_port}
    engine = LLMEngine(gqa_dir, block_size=16, kv_events=settings)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    try:
        time.sleep(0.3)  # the subscription reaches the PUB socket
        prompt = [(7 * i) % 200 + 3 for i in range(40)]  # two full blocks
        engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0))
        stored: list[int] = []
        while sub.poll(2000):
            for event in DECODER.decode(sub.recv_multipart()[2]).events:
                if isinstance(event, BlockStored):
                    stored += [int(h) for h in event.block_hashes]
            if stored[:2] == block_hashes(prompt, 16):
                break
        assert stored[:2] == block_hashes(prompt, 16)
    finally:
        sub.close(linger=0)
        ctx.term()
        engine.shutdown()
