"""The gateway's KV index: longest cached prefix from the replicas' events, eviction, speculative
entries, gaps closed by replay (or the replica's entries dropped), replicas leaving, and load-only
routing once a replica's events stop."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from typing import Any

import msgpack
from frontier_gateway.kv_index import (
    EVENTS_STOPPED,
    KV_HIT,
    KV_MISS,
    KvIndex,
    KvSubscriber,
    block_hashes,
    request_blocks,
)
from frontier_gateway.pools import Pool
from frontier_runtime.engine.kv_events import KvEventPublisher
from frontier_runtime.engine.kv_events import block_hashes as runtime_block_hashes

BS = 4
A, B, C = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass(eq=False)
class Cand:
    url: str
    outstanding: int = 0


def stored(tokens: list[int], parent: Any = None, hashes: list[Any] | None = None) -> list[Any]:
    """A BlockStored of ``tokens`` as the runtime sends it (engine hashes = the chained keys)."""
    keys = hashes if hashes is not None else runtime_block_hashes(tokens, BS)
    return ["BlockStored", keys, parent, tokens, BS, None, "GPU", None]


def index(clock: Clock | None = None, **kw: Any) -> KvIndex:
    idx = KvIndex(block_size=BS, clock=clock or Clock(), **kw)
    for url in (A, B, C):
        idx.add_replica(url)
    return idx


SYSTEM = list(range(100, 116))  # 4 blocks
TURN = SYSTEM + [7, 7, 7, 7, 8, 8, 8, 8, 9]  # 6 full blocks + 1 token


def test_the_gateway_hashes_blocks_exactly_as_the_runtime_does() -> None:
    assert block_hashes(TURN, BS) == runtime_block_hashes(TURN, BS)
    assert len(request_blocks(SYSTEM, BS)) == 3  # at most n - 1 tokens: a whole prompt never hits


def test_the_replica_with_the_longest_consecutive_prefix_wins() -> None:
    idx = index()
    idx.apply(A, [stored(SYSTEM)])  # the system prompt only
    idx.apply(B, [stored(TURN[:24])])  # the system prompt and the history
    keys = request_blocks(TURN, BS)
    assert [idx.matched(u, keys) for u in (A, B, C)] == [4, 6, 0]
    chosen, outcome = idx.choose([Cand(A), Cand(B), Cand(C)], keys)
    assert chosen.url == B and outcome == KV_HIT
    # A hole breaks the run: a later block held without the ones before it counts for nothing.
    idx.apply(C, [stored(TURN[4:8], parent=None, hashes=[999])])
    assert idx.matched(C, keys) == 0


def test_a_stored_block_is_keyed_from_its_parent_whatever_the_engines_hash() -> None:
    idx = index()  # vLLM's hashes are its own (sha256 bytes): the index keys blocks by their tokens
    idx.apply(A, [["BlockStored", [b"h1", b"h2"], None, TURN[:8], BS, None, "GPU"]])
    idx.apply(A, [["BlockStored", [b"h3"], b"h2", TURN[8:12], BS, None, "GPU"]])
    assert idx.matched(A, request_blocks(TURN, BS)) == 3
    idx.apply(A, [["BlockRemoved", [b"h2"], "GPU"]])
    assert idx.matched(A, request_blocks(TURN, BS)) == 1


def test_load_outweighs_a_short_hit_but_not_a_long_one() -> None:
    idx = index(load_weight_blocks=2.0)
    idx.apply(A, [stored(TURN[:24])])
    keys = request_blocks(TURN, BS)  # 6 blocks, all on A
    assert idx.choose([Cand(A, outstanding=2), Cand(B)], keys)[0].url == A  # 0 + 4 < 6 + 0
    assert idx.choose([Cand(A, outstanding=4), Cand(B)], keys)[0].url == B  # 0 + 8 > 6 + 0


def test_replicas_that_tie_on_a_shared_prefix_take_new_conversations_in_turn() -> None:
    idx = index()
    for url in (A, B, C):
        idx.apply(url, [stored(SYSTEM)])  # every replica holds the shared system prompt
    firsts = []
    for tail in range(3):  # three new conversations: equal hits, equal load
        keys = request_blocks(SYSTEM + [tail] * 9, BS)
        firsts.append(idx.choose([Cand(A), Cand(B), Cand(C)], keys)[0].url)
    assert sorted(firsts) == [A, B, C]


def test_of_equal_costs_the_replica_with_fewer_in_flight_wins() -> None:
    idx = index(load_weight_blocks=1.0)
    idx.apply(A, [stored(TURN[:24])])  # 6 blocks: A costs 0 + 1 x 3 = 3
    idx.apply(B, [stored(TURN[:12])])  # 3 blocks: B costs 3 + 1 x 0 = 3
    keys = request_blocks(TURN, BS)
    for _ in range(3):
        assert idx.choose([Cand(A, outstanding=3), Cand(B)], keys)[0].url == B


def test_of_equal_costs_and_loads_the_replica_that_took_fewer_recent_decisions_wins() -> None:
    idx = index()
    for url in (A, B, C):
        idx.apply(url, [stored(SYSTEM)])
    idx.recent.extend([A, A, B])  # A took two of the last decisions, B one, C none
    keys = request_blocks(SYSTEM + [1] * 9, BS)
    assert idx.choose([Cand(A), Cand(B), Cand(C)], keys)[0].url == C
    assert idx.choose([Cand(A), Cand(B), Cand(C)], keys)[0].url in (B, C)


def test_a_replica_over_its_share_of_recent_decisions_is_passed_over_however_much_it_holds() -> None:
    idx = index(load_weight_blocks=0.0, share_cap=1.5)  # load alone would never move it
    idx.apply(A, [stored(TURN[:24])])  # only A holds the prefix
    keys = request_blocks(TURN, BS)
    chosen = [idx.choose([Cand(A), Cand(B), Cand(C)], keys)[0].url for _ in range(64)]
    # A may take 1.5 / 3 of the last 32 decisions: the hit wins only while A is under that share.
    assert chosen[:16] == [A] * 16 and chosen[16] != A
    assert all(chosen[i : i + 32].count(A) <= 16 for i in range(33))


def test_removed_and_cleared_blocks_leave_the_index() -> None:
    idx = index()
    idx.apply(A, [stored(TURN[:24])])
    keys = request_blocks(TURN, BS)
    idx.apply(A, [["BlockRemoved", [keys[4]], "GPU"]])
    assert idx.matched(A, keys) == 4
    idx.apply(A, [["AllBlocksCleared"]])
    assert idx.matched(A, keys) == 0 and idx.where == {}


def test_a_speculative_entry_counts_until_its_ttl_then_not() -> None:
    clock = Clock()
    idx = index(clock, speculative_ttl_s=2.0)
    keys = request_blocks(TURN, BS)
    chosen, outcome = idx.choose([Cand(A), Cand(B)], keys)
    assert outcome == KV_MISS
    idx.routed(chosen.url, keys)
    # A burst with the same prefix follows the first request before any event arrived.
    again, outcome = idx.choose([Cand(A), Cand(B)], keys)
    assert again.url == chosen.url and outcome == KV_HIT and idx.matched(chosen.url, keys) == 6
    clock.now += 2.5
    assert idx.matched(chosen.url, keys) == 0


def test_a_replica_that_leaves_takes_its_entries_with_it() -> None:
    idx = index()
    idx.apply(A, [stored(TURN[:24])])
    idx.apply(B, [stored(SYSTEM)])
    idx.routed(A, request_blocks(TURN + [1, 2, 3, 4, 5], BS))
    idx.remove_replica(A)
    assert A not in idx.replicas
    assert all(A not in holders for holders in idx.where.values())
    assert all(url != A for _, url in idx.speculative)
    assert idx.matched(B, request_blocks(TURN, BS)) == 4


def test_a_pool_whose_replicas_changed_drops_the_ones_that_left() -> None:
    from frontier_gateway.config import KvRoutingConfig
    from frontier_gateway.kv_index import KvRouting

    pool = Pool("m", [A, B])
    pool.kv = KvRouting(KvRoutingConfig(tokenizer_dir="/nonexistent", block_size=BS), [A, B])
    pool.kv.index.apply(A, [stored(TURN[:24])])
    pool.set_urls([B, C])
    assert set(pool.kv.index.replicas) == {B, C} and pool.kv.index.where == {}


def test_events_that_stop_turn_routing_to_load_only_and_are_counted() -> None:
    clock = Clock()
    idx = index(clock, stale_after_s=10.0)
    idx.apply(A, [stored(TURN[:24])])
    keys = request_blocks(TURN + [1, 2, 3, 4, 5, 6, 7, 8], BS)  # two blocks A does not hold
    cands = [Cand(A), Cand(B, outstanding=0)]
    chosen, outcome = idx.choose(cands, keys)
    assert chosen.url == A and outcome == KV_HIT
    idx.routed(A, keys)  # A now owes events for the new blocks
    idx.routed(B, request_blocks(list(range(500, 540)), BS))  # and so does B
    clock.now += 11  # nothing came from either
    assert not idx.live(A) and not idx.live(B)
    chosen, outcome = idx.choose([Cand(A, outstanding=1), Cand(B, outstanding=0)], keys)
    assert outcome == EVENTS_STOPPED and chosen.url == B  # load alone
    assert idx.outcomes[EVENTS_STOPPED] == 1
    idx.apply(A, [])  # any batch from A: live again
    assert idx.live(A) and idx.choose([Cand(A), Cand(B)], keys)[1] == KV_HIT


def test_an_idle_replica_with_nothing_owed_stays_live() -> None:
    clock = Clock()
    idx = index(clock, stale_after_s=10.0)
    idx.apply(A, [stored(TURN[:24])])
    keys = request_blocks(TURN, BS)
    idx.routed(A, keys)  # it held every block: it owes no event
    clock.now += 60
    assert idx.live(A)


# -- the subscription over ZMQ, against the runtime's publisher ----------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_gap_is_closed_by_replay_and_one_replay_cannot_close_drops_the_entries() -> None:
    async def scenario() -> None:
        port, replay_port = _free_port(), _free_port()
        pub = KvEventPublisher(port, replay_port, topic="kv", buffer_steps=1000, host="127.0.0.1")
        url = "http://127.0.0.1:8000"
        idx = KvIndex(block_size=BS)
        sub = KvSubscriber(idx, port, replay_port, replay_timeout_s=0.5)
        try:
            # Batches published before the gateway subscribed: the first one it sees has seq > 0.
            pub.publish([stored(SYSTEM)])
            pub.publish([stored(TURN[16:24], parent=runtime_block_hashes(SYSTEM, BS)[-1])])
            await asyncio.sleep(0.2)
            sub.sync([url])
            keys = request_blocks(TURN, BS)
            probe = list(range(900, 908))
            while idx.replicas[url].last_seq is None:  # PUB drops until the subscription is in place
                pub.publish([stored(probe)])
                await asyncio.sleep(0.05)
            await _until(lambda: idx.matched(url, keys) == 6)  # the replay brought seq 0 and 1
            assert idx.replicas[url].gaps == 1

            # A gap no replay closes (here its socket does not answer): the entries are dropped.
            state = idx.replicas[url]
            assert state.last_seq is not None
            state.last_seq -= 2  # as if two batches had been lost on the way
            sub.ports[url] = (port, _free_port())
            pub.publish([stored([1, 2, 3, 4])])
            await _until(lambda: state.drops == 1)
            await _until(lambda: idx.matched(url, request_blocks([1, 2, 3, 4, 5], BS)) == 1)
            assert idx.matched(url, keys) == 0
        finally:
            sub.close()
            pub.close()

    asyncio.run(scenario())


def test_the_index_decodes_map_encoded_batches_too() -> None:
    from frontier_gateway.kv_index import decode_batch

    payload = msgpack.packb(
        {
            "ts": 1.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [5],
                    "parent_block_hash": None,
                    "token_ids": SYSTEM[:4],
                    "block_size": 4,
                },
                {"type": "BlockRemoved", "block_hashes": [5]},
                {"type": "AllBlocksCleared"},
            ],
        }
    )
    assert [e[0] for e in decode_batch(payload)] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
