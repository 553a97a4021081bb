"""What routing by the replicas' KV events buys, beside the gateway's other policies, in one run.

    .venv/bin/python bench/kv_routing.py [--replicas 4] [--conversations 16] [--turns 6]
                                         [--rate 0 (calibrate)] [--duration-s 60] [--weights 2,8,32]

Four runtime processes of the tiny model (one intra-op thread each, ``runtime.kv_events`` on, each
with its own event ports, a KV cache of ``--kv-cache-mb``: 40 MiB holds ~10,000 tokens, about four
conversations at their longest, so a replica that sees every conversation cannot keep them all;
at 24 MiB four outgrow it and LRU evicts the one whose turn comes next) sit
behind one gateway process per policy:

- ``least-loaded``: affinity off: the replica with the fewest requests in flight, ties rotating (the
  gateway's round-robin);
- ``prefix-hash``: today's default: the rendezvous hash of the prompt's first 256 characters;
- ``kv-events``: the pool's ``kv_routing``: the longest cached prefix from the replicas' events,
  plus ``load_weight_blocks`` per request in flight, capped at ``share_cap``.

Steps, each on the same runtimes, each run with its own system prompt (no run inherits another's
cache):

1. **Capacity** (unless ``--rate`` is given): least-loaded on the multi-turn workload at a ladder
   of rates, ``--calibrate-s`` each; the first rate whose TTFT p50 is over twice the lowest rate's
   (the queues have begun to grow), or that sheds, is the capacity; the runs that follow go at
   ``--load`` (70 %) of it.
2. **Load weight**: kv-events at that rate for each of ``--weights`` (``--sweep-s`` each); the one
   of least TTFT p90 is kept.
3. **The A/B**, ``--duration-s`` per policy and workload:
   - ``multi-turn``: conversations sharing one long system prompt; each turn appends a user message
     and the previous answer to its history; turns arrive as a Poisson process, each to a
     conversation not in flight picked at random (none idle: counted shed);
   - ``no-reuse``: random prompts as long as an average multi-turn prompt, at the same rate.

Per run: TTFT p50/p90/p99 (streamed, to the first content chunk), completed requests per second,
requests shed (any non-200), and each replica's prefix-cache hit rate (hit tokens / queried tokens,
from the runtimes' own counters). The machine's load average is printed with each row: on a shared
machine the absolute figures move, the ratios between policies are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import KEY, MODEL, free_port, gateway_serving, process, wait_http  # noqa: E402
from gateway_overhead import runtime_command as serving  # noqa: E402

POLICIES = ("least-loaded", "prefix-hash", "kv-events")
BLOCK_SIZE = 16
TOKENS_PER_WORD = 2.8  # the tiny tokenizer on VOCAB, measured


def runtime_command(
    model_dir: Path, work: Path, port: int, events: tuple[int, int], kv_bytes: int
) -> list[str]:
    """A replica publishing its KV events on ``events`` (publish, replay), with ``kv_bytes`` of cache."""
    return serving(
        model_dir,
        work,
        port,
        max_seq_len=2048,
        max_concurrency=16,
        queue={"max_length": 256, "timeout_ms": 60_000},
        cpu_kv_cache_bytes=kv_bytes,
        block_size=BLOCK_SIZE,
        kv_events={"enabled": True, "port": events[0], "replay_port": events[1]},
    )


def gateway_command(
    policy: str,
    urls: list[str],
    events: dict[str, tuple[int, int]],
    model_dir: Path,
    work: Path,
    port: int,
    weight: float,
    share_cap: float,
) -> list[str]:
    pool: dict[str, object] = {"name": MODEL, "replicas": urls}
    affinity = {"mode": "off" if policy == "least-loaded" else "prefix"}
    if policy == "kv-events":
        pool["kv_routing"] = {
            "tokenizer_dir": str(model_dir),
            "block_size": BLOCK_SIZE,
            "ports": events,
            "load_weight_blocks": weight,
            "share_cap": share_cap,
        }
    return gateway_serving([pool], work, f"{policy}-{port}", port, affinity=affinity, retries=0)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of words."""
    return words(rng, max(1, round(tokens / TOKENS_PER_WORD)))


VOCAB = [
    "cache", "block", "token", "route", "prefix", "model", "serve", "batch", "queue", "replica",
    "event", "index", "tenant", "quota", "stream", "answer", "prompt", "system", "history", "turn",
]  # fmt: skip


async def one_request(
    client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[int, float, str]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    start = time.monotonic()
    ttft = float("nan")
    text = []
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return response.status_code, ttft, ""
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"][0].get("delta", {}).get("content")
                if delta:
                    if ttft != ttft:
                        ttft = time.monotonic() - start
                    text.append(delta)
    except httpx.HTTPError:
        return 599, ttft, ""
    return 200, ttft, "".join(text)


async def run_workload(
    url: str, kind: str, args: argparse.Namespace, seed: int, rate: float, duration_s: float
) -> dict[str, Any]:
    rng = random.Random(seed)  # the words: each policy its own system prompt
    arrivals = random.Random(kind)  # the arrival times: the same for every policy
    system = text(rng, args.system_tokens)
    histories = [[{"role": "system", "content": system}] for _ in range(args.conversations)]
    turns = [0] * args.conversations
    busy = [False] * args.conversations
    results: list[tuple[int, float]] = []
    tasks: list[asyncio.Task[None]] = []
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(headers=headers, timeout=120, limits=limits) as client:

        async def turn(i: int) -> None:
            if kind == "multi-turn":
                histories[i].append({"role": "user", "content": text(rng, args.user_tokens)})
                messages = histories[i]
            else:
                # as long as the average multi-turn prompt (its history half grown)
                length = args.system_tokens + (args.user_tokens + args.max_tokens) * (args.turns + 1) // 2
                messages = [{"role": "user", "content": text(rng, length)}]
            status, ttft, answer = await one_request(client, url, messages, args.max_tokens)
            results.append((status, ttft))
            if kind == "multi-turn":
                histories[i].append({"role": "assistant", "content": answer})
                turns[i] += 1
                if turns[i] >= args.turns:  # a finished conversation starts over as a new one
                    histories[i] = [{"role": "system", "content": system}]
                    turns[i] = 0
            busy[i] = False

        started = time.monotonic()
        while time.monotonic() - started < duration_s:
            await asyncio.sleep(arrivals.expovariate(rate))
            idle = [j for j in range(args.conversations) if not busy[j]]
            if not idle:
                results.append((0, float("nan")))  # the client side had no idle conversation: counted shed
                continue
            # A conversation at random among the idle ones: taken in a fixed cycle, 16 conversations
            # over 4 replicas would land each on the same replica every turn under round-robin.
            i = arrivals.choice(idle)
            busy[i] = True
            tasks.append(asyncio.create_task(turn(i)))
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    ok = [t for s, t in results if s == 200 and t == t]
    return {
        "ttft": np.percentile(ok, [50, 90, 99]) if ok else [float("nan")] * 3,
        "rate": len(ok) / elapsed,
        "shed": sum(1 for s, _ in results if s != 200),
        "sent": len(results),
    }


def prefix_counters(urls: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=5).text
        q = sum(
            float(v)
            for v in re.findall(r"^vllm:prefix_cache_queries(?:_total)?(?:\{[^}]*\})? (\S+)$", text, re.M)
        )
        h = sum(
            float(v)
            for v in re.findall(r"^vllm:prefix_cache_hits(?:_total)?(?:\{[^}]*\})? (\S+)$", text, re.M)
        )
        out[url] = (q, h)
    return out


def tokenize_cost(model_dir: Path, args: argparse.Namespace) -> float:
    """Microseconds the gateway spends per multi-turn request on the chat template, the tokenizer
    and the block keys (what KV routing adds before a request leaves)."""
    from frontier_gateway.kv_index import PromptTokens, request_blocks

    rng = random.Random(7)
    tokens = PromptTokens(model_dir)
    history = [{"role": "system", "content": text(rng, args.system_tokens)}]
    for _ in range(args.turns):
        history += [
            {"role": "user", "content": text(rng, args.user_tokens)},
            {"role": "assistant", "content": text(rng, args.max_tokens)},
        ]
    body = {"messages": history}
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        ids = tokens.for_body(body)
        assert ids is not None
        request_blocks(ids, BLOCK_SIZE)
    return (time.perf_counter() - start) / n * 1e6


class Bench:
    """The runtimes, and one gateway per run in front of them."""

    def __init__(self, stack: ExitStack, work: Path, model_dir: Path, args: argparse.Namespace) -> None:
        self.stack, self.work, self.model_dir, self.args = stack, work, model_dir, args
        ports = [free_port() for _ in range(args.replicas)]
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        self.events = {u: (free_port(), free_port()) for u in self.urls}
        procs = []
        for port, url in zip(ports, self.urls, strict=True):
            log = work / f"runtime-{port}.log"
            cmd = runtime_command(model_dir, work, port, self.events[url], args.kv_cache_mb * 1024 * 1024)
            procs.append((stack.enter_context(process(cmd, log, {"OMP_NUM_THREADS": "1"})), log, url))
        for proc, log, url in procs:
            wait_http(url + "/health/ready", proc, log)
        self.seed = 0

    def run(self, policy: str, kind: str, rate: float, duration_s: float, weight: float) -> dict[str, Any]:
        self.seed += 1
        gport = free_port()
        glog = self.work / f"gateway-{policy}-{kind}-{gport}.log"
        cmd = gateway_command(
            policy, self.urls, self.events, self.model_dir, self.work, gport, weight, self.args.share_cap
        )
        with process(cmd, glog) as gproc:
            gurl = f"http://127.0.0.1:{gport}"
            wait_http(gurl + "/health/ready", gproc, glog)
            time.sleep(1.0)  # the KV subscriptions connect
            before = prefix_counters(self.urls)
            result = asyncio.run(run_workload(gurl, kind, self.args, self.seed, rate, duration_s))
            after = prefix_counters(self.urls)
            gproc.terminate()
            gproc.wait(timeout=20)
        hits = []
        for url in self.urls:
            q = after[url][0] - before[url][0]
            h = after[url][1] - before[url][1]
            hits.append(h / q if q else float("nan"))
        result["hits"] = hits
        result["load"] = os.getloadavg()[0]
        result["offered"] = rate
        return result


def line(label: str, r: dict[str, Any]) -> str:
    p50, p90, p99 = r["ttft"]
    return (
        f"{label:34s} TTFT p50 {p50 * 1000:6.0f} ms  p90 {p90 * 1000:6.0f} ms  p99 {p99 * 1000:6.0f} ms  "
        f"{r['rate']:5.2f} req/s  shed {r['shed']}/{r['sent']}  "
        f"hit rate per replica {' '.join(f'{h:.2f}' for h in r['hits'])}  load {r['load']:.1f}"
    )


def calibrate(bench: Bench, args: argparse.Namespace) -> float:
    """The capacity of the replicas under least-loaded routing on the multi-turn workload: the first
    rate of the ladder whose TTFT p50 is over twice the first rate's (the queue has begun to grow:
    p50, because a 20 s window holds too few requests for a steady p90), or that sheds."""
    base = None
    rate = 0.0
    for rate in (float(r) for r in args.ladder.split(",")):
        r = bench.run("least-loaded", "multi-turn", rate, args.calibrate_s, 0.0)
        print(line(f"capacity: least-loaded @ {rate:.2f}/s", r), flush=True)
        if base is None:
            base = r["ttft"][0]
        elif r["ttft"][0] > 2 * base or r["shed"]:
            return rate
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rate", type=float, default=0.0, help="turns per second (Poisson); 0: calibrate")
    parser.add_argument("--ladder", default="0.5,1,1.5,2,2.5,3,4,5", help="rates tried to find capacity")
    parser.add_argument("--calibrate-s", type=float, default=20.0)
    parser.add_argument("--load", type=float, default=0.7, help="fraction of capacity the runs go at")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--system-tokens", type=int, default=400)
    parser.add_argument("--user-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kv-cache-mb", type=int, default=40, help="each replica's KV cache")
    parser.add_argument("--workloads", default="multi-turn,no-reuse")
    parser.add_argument("--weights", default="2,8,32", help="kv_routing.load_weight_blocks tried")
    parser.add_argument("--sweep-s", type=float, default=30.0)
    parser.add_argument("--share-cap", type=float, default=1.25, help="kv_routing.share_cap")
    args = parser.parse_args()
    from frontier_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_dir = make_tiny_checkpoint(work / "model", seed=0, max_position_embeddings=4096)
        print(
            f"gateway tokenization + block keys per request: {tokenize_cost(model_dir, args):.0f} us",
            flush=True,
        )
        bench = Bench(stack, work, model_dir, args)
        rate = args.rate
        if rate <= 0:
            capacity = calibrate(bench, args)
            rate = args.load * capacity
            print(f"capacity ~{capacity:.2f} req/s: the runs go at {rate:.2f} req/s", flush=True)
        weights = [float(w) for w in args.weights.split(",")]
        weight = weights[0]
        if len(weights) > 1:
            best = float("inf")
            for w in weights:
                r = bench.run("kv-events", "multi-turn", rate, args.sweep_s, w)
                print(line(f"weight: kv-events w={w:g}", r), flush=True)
                if r["ttft"][1] < best:
                    best, weight = r["ttft"][1], w
            print(f"load_weight_blocks {weight:g} (least TTFT p90)", flush=True)
        rows = []
        for kind in args.workloads.split(","):
            for policy in POLICIES:
                r = bench.run(policy, kind, rate, args.duration_s, weight)
                rows.append((kind, policy, r))
                print(line(f"{kind} {policy}", r), flush=True)
        print()
        print(f"rate {rate:.2f} req/s, load_weight_blocks {weight:g}, share_cap {args.share_cap:g}")
        print(
            "| workload | policy | TTFT p50 ms | p90 ms | p99 ms | req/s | shed | prefix hit rate per replica | load avg |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for kind, policy, r in rows:
            p50, p90, p99 = r["ttft"]
            print(
                f"| {kind} | {policy} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | {p99 * 1000:.0f} | "
                f"{r['rate']:.2f} | {r['shed']}/{r['sent']} | {' '.join(f'{h:.2f}' for h in r['hits'])} | {r['load']:.1f} |"
            )
        for kind in args.workloads.split(","):
            by = {policy: r for k, policy, r in rows if k == kind}
            rr, kv = by["least-loaded"], by["kv-events"]
            print(
                f"{kind}: kv-events / least-loaded TTFT p90 {kv['ttft'][1] / rr['ttft'][1]:.2f}, "
                f"throughput {kv['rate'] / rr['rate']:.2f}, shed {kv['shed']} vs {rr['shed']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
