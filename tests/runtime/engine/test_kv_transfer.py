"""Prefill/decode disaggregation: a prefill engine's KV blocks pulled over a real TCP socket into a
decode engine's paged cache, real forward passes on the tiny model on both sides.

Every test here starts a server on a socket (the prefill's transfer listener; some a relay or a
prefill replica in a process of its own), so the module is in tests/conftest.py's PROC_TESTS.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from frontier_runtime.engine.api import KvTransferError
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import KvTransferParams, SamplingParams

BLOCK = 16
BASE = {"num_blocks": 192, "block_size": BLOCK, "max_seq_len": 1024, "device": "cpu", "dtype": "float32"}
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
TO_DECODE = SamplingParams(
    max_tokens=1, temperature=0.0, ignore_eos=True, kv_transfer=KvTransferParams(do_remote_decode=True)
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompt_of(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4096) for _ in range(n)]


@pytest.fixture(scope="module")
def colocated(gqa_dir: Path) -> Iterator[LLMEngine]:
    engine = LLMEngine(EngineConfig(gqa_dir, **BASE))
    yield engine
    engine.shutdown()


def prefill_engine(model_dir: Path, **transfer: object) -> LLMEngine:
    settings = {"role": "prefill", "host": "127.0.0.1", "port": free_port(), **transfer}
    return LLMEngine(EngineConfig(model_dir, **BASE, kv_transfer=settings))


def decode_engine(model_dir: Path, **transfer: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir, **BASE, kv_transfer={"role": "decode", **transfer}))


@pytest.fixture(scope="module")
def prefill(gqa_dir: Path) -> Iterator[LLMEngine]:
    engine = prefill_engine(gqa_dir)
    yield engine
    engine.shutdown()


@pytest.fixture
def decode(gqa_dir: Path) -> Iterator[LLMEngine]:
    engine = decode_engine(gqa_dir)
    yield engine
    engine.shutdown()


def run_prefill(engine: LLMEngine, rid: str, prompt: list[int]) -> KvTransferParams:
    engine.add_request(rid, prompt, TO_DECODE)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    params = outs[-1].kv_transfer_params
    assert params is not None and outs[-1].finished
    return params


def run_decode(engine: LLMEngine, rid: str, prompt: list[int], params: KvTransferParams) -> list[int]:
    engine.add_request(rid, prompt, replace(GREEDY, kv_transfer=params))
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.new_token_ids
    return tokens


def wait_for(cond: Callable[[], bool], engine: LLMEngine, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        engine.end_leases()
        time.sleep(0.01)


@pytest.mark.parametrize("length", [17, 100, 333, 517])
def test_greedy_tokens_through_prefill_then_decode_equal_a_colocated_replica(
    colocated: LLMEngine, prefill: LLMEngine, decode: LLMEngine, length: int
) -> None:
    prompt = prompt_of(length, seed=length)
    params = run_prefill(prefill, f"p{length}", prompt)
    assert params.do_remote_prefill and not params.do_remote_decode
    assert params.remote_engine_id == prefill.kv_transfer.engine_id
    assert len(params.remote_block_ids) == (length - 1) // BLOCK
    assert run_decode(decode, f"p{length}", prompt, params) == colocated.generate([prompt], GREEDY)[0]
    assert decode.kv_transfer.blocks_pulled == (length - 1) // BLOCK


def test_a_1k_token_prompt_is_handed_over_block_by_block(
    colocated: LLMEngine, prefill: LLMEngine, decode: LLMEngine
) -> None:
    prompt = prompt_of(1000, seed=7)
    params = run_prefill(prefill, "long", prompt)
    tokens = run_decode(decode, "long", prompt, params)
    assert tokens == colocated.generate([prompt], GREEDY)[0]
    assert decode.kv_transfer.blocks_pulled == 62
    # The decode computed only the tail past the pulled blocks: 62 x 16 of 1000 prompt tokens were hits.
    assert decode.block_manager.prefix_hits == 62 * BLOCK


def test_pulled_blocks_are_prefix_cache_hits_for_a_later_request_on_the_decode_side(
    colocated: LLMEngine, prefill: LLMEngine, decode: LLMEngine
) -> None:
    system = prompt_of(320, seed=3)  # 20 blocks shared by both requests
    first, second = system + prompt_of(40, seed=4), system + prompt_of(50, seed=5)
    run_decode(decode, "first", first, run_prefill(prefill, "first", first))
    pulled = decode.kv_transfer.blocks_pulled
    hits = decode.block_manager.prefix_hits
    tokens = run_decode(decode, "second", second, run_prefill(prefill, "second", second))
    assert tokens == colocated.generate([second], GREEDY)[0]
    # Only the blocks past the shared 20 moved; the 20 were found in the decode's own cache.
    assert decode.kv_transfer.blocks_pulled - pulled == (len(second) - 1) // BLOCK - 20
    assert decode.block_manager.prefix_hits - hits == ((len(second) - 1) // BLOCK) * BLOCK


def test_a_claimed_lease_frees_the_prefill_blocks(prefill: LLMEngine, decode: LLMEngine) -> None:
    prompt = prompt_of(200, seed=11)
    params = run_prefill(prefill, "claimed", prompt)
    held = set(params.remote_block_ids)
    assert all(prefill.block_manager.ref_counts[b] == 1 for b in held)
    run_decode(decode, "claimed", prompt, params)
    wait_for(lambda: len(prefill.kv_transfer.leases) == 0, prefill)
    assert all(prefill.block_manager.ref_counts[b] == 0 for b in held)


def test_an_unclaimed_lease_frees_its_blocks_when_it_expires(gqa_dir: Path) -> None:
    engine = prefill_engine(gqa_dir, lease_s=0.3)
    try:
        free = engine.block_manager.num_free_blocks
        params = run_prefill(engine, "never-claimed", prompt_of(200, seed=12))
        assert engine.block_manager.num_free_blocks == free - len(params.remote_block_ids) == free - 12
        engine.end_leases()
        assert engine.block_manager.num_free_blocks == free - 12  # not yet: the lease still runs
        time.sleep(0.35)
        engine.end_leases()
        assert engine.block_manager.num_free_blocks == free
        assert engine.kv_transfer.leases_expired == 1
    finally:
        engine.shutdown()


def test_a_pull_of_an_expired_lease_recomputes_the_prompt(colocated: LLMEngine, gqa_dir: Path) -> None:
    engine = prefill_engine(gqa_dir, lease_s=0.05)
    dec = decode_engine(gqa_dir, on_failure="recompute")
    try:
        prompt = prompt_of(150, seed=13)
        params = run_prefill(engine, "late", prompt)
        time.sleep(0.1)
        engine.end_leases()
        assert run_decode(dec, "late", prompt, params) == colocated.generate([prompt], GREEDY)[0]
        assert dec.kv_transfer.pulls_failed == 1 and dec.kv_transfer.blocks_pulled == 0
    finally:
        engine.shutdown()
        dec.shutdown()


def test_a_request_aborted_while_its_blocks_are_pulled_leaves_no_block_held(
    prefill: LLMEngine, decode: LLMEngine
) -> None:
    prompt = prompt_of(600, seed=17)
    params = run_prefill(prefill, "gone", prompt)
    free = decode.block_manager.num_free_blocks
    decode.add_request("gone", prompt, replace(GREEDY, kv_transfer=params))
    assert decode.abort("gone")
    outs = []
    while decode.has_unfinished():
        outs += decode.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("gone", "abort")]
    assert decode.block_manager.num_free_blocks == free
    assert all(count == 0 for count in decode.block_manager.ref_counts)


def test_a_decode_whose_cache_layout_differs_is_refused_by_the_prefill_naming_both(
    prefill: LLMEngine, gqa_dir: Path
) -> None:
    """A bfloat16 KV cache cannot take a float32 cache's blocks: no byte moves, and ``fail`` says why."""
    dec = LLMEngine(
        EngineConfig(
            gqa_dir, **BASE, kv_cache_dtype="bfloat16", kv_transfer={"role": "decode", "on_failure": "fail"}
        )
    )
    try:
        prompt = prompt_of(100, seed=19)
        assert run_decode(dec, "mixed", prompt, run_prefill(prefill, "mixed", prompt)) == []
        [(rid, error)] = dec.take_failed()
        assert "refused the pull: the caches' block layouts differ" in str(error)
        assert "torch.bfloat16" in str(error) and "torch.float32" in str(error)
        assert dec.kv_transfer.blocks_pulled == 0
    finally:
        dec.shutdown()


# -- a prefill replica that dies mid-transfer ------------------------------------------------------

PREFILL_PROCESS = """
import json, sys
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import KvTransferParams, SamplingParams
model, port, prompt = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
base = json.loads(sys.argv[4])
engine = LLMEngine(EngineConfig(model, **base, kv_transfer={"role": "prefill", "host": "127.0.0.1", "port": port}))
engine.add_request("r", prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                   kv_transfer=KvTransferParams(do_remote_decode=True)))
outs = []
while engine.has_unfinished():
    outs += engine.step()
print(json.dumps(outs[-1].kv_transfer_params.to_json()), flush=True)
sys.stdin.read()  # serve the lease until the test ends it
"""


class DyingRelay:
    """A TCP relay between the decode and a prefill process: it passes the prefill's answer on
    until ``cut_after`` bytes, then SIGKILLs the prefill process and closes both sides."""

    def __init__(self, target_port: int, process: subprocess.Popen[str], cut_after: int) -> None:
        self.target_port = target_port
        self.process = process
        self.cut_after = cut_after
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.thread = threading.Thread(target=self._relay, daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        client, _ = self.server.accept()
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        threading.Thread(target=self._pipe_up, args=(client, upstream), daemon=True).start()
        passed = 0
        while passed < self.cut_after:
            data = upstream.recv(min(65536, self.cut_after - passed))
            if not data:
                break
            client.sendall(data)
            passed += len(data)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        client.close()
        upstream.close()
        self.server.close()

    @staticmethod
    def _pipe_up(client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                upstream.sendall(data)
        except OSError:
            pass


def start_prefill_process(model_dir: Path, prompt: list[int]) -> tuple[subprocess.Popen[str], int, dict]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PREFILL_PROCESS,
            str(model_dir),
            str(port),
            json.dumps(prompt),
            json.dumps(BASE),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the prefill process exited before answering"
    return proc, port, json.loads(line)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_prefill_replica_killed_mid_transfer(colocated: LLMEngine, gqa_dir: Path, policy: str) -> None:
    """``recompute``: the decode replica computes the prompt itself and answers exactly as a
    colocated replica; ``fail``: the request ends with an error naming the replica and how far the
    pull got. Either way the pull's reserved blocks go back to the free list."""
    prompt = prompt_of(1000, seed=21)
    proc, port, answer = start_prefill_process(gqa_dir, prompt)
    dec = decode_engine(gqa_dir, on_failure=policy)
    try:
        one_block = 2 * 4 * 4 * 32 * BLOCK * 4  # K and V x 4 layers x 4 KV heads x 32 dims x 16 tokens x fp32
        relay = DyingRelay(port, proc, cut_after=len(b'{"ok": true}\n') + 3 * (12 + one_block + 16) + 100)
        params = KvTransferParams(
            **{**answer, "remote_port": relay.port, "remote_block_ids": tuple(answer["remote_block_ids"])}
        )
        free = dec.block_manager.num_free_blocks
        tokens = run_decode(dec, "r", prompt, params)
        assert proc.poll() is not None  # the prefill replica is gone
        failed = dec.take_failed()
        if policy == "recompute":
            assert tokens == colocated.generate([prompt], GREEDY)[0]
            assert failed == []
        else:
            assert tokens == []
            [(rid, error)] = failed
            assert rid == "r" and isinstance(error, KvTransferError)
            assert f"prefill replica 127.0.0.1:{relay.port}" in str(error)
            assert "after 3 of 62 blocks" in str(error) or "in block 4 of 62" in str(error)
            assert dec.block_manager.num_free_blocks == free
        assert dec.kv_transfer.pulls_failed == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        dec.shutdown()
