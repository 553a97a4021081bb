"""What routing by the replicas' KV events buys, beside the gateway's other policies, in one run.

    .venv/bin/python bench/kv_routing.py [--replicas 4] [--conversations 24] [--turns 6] [--rate 2.0]
                                         [--duration-s 60] [--system-tokens 600]

Four runtime processes of the tiny model (one intra-op thread each, ``runtime.kv_events`` on, each
with its own event ports) sit behind one gateway process per policy:

- ``least-loaded``: affinity off: the replica with the fewest requests in flight, ties rotating (the
  gateway's round-robin);
- ``prefix-hash``: today's default: the rendezvous hash of the prompt's first 256 characters;
- ``kv-events``: the pool's ``kv_routing``: the longest cached prefix from the replicas' events, plus
  a weight per request in flight.

Workloads, each policy in turn on the same runtimes (each policy's conversations use their own
system prompt, so no policy inherits another's cache):

- ``multi-turn``: conversations sharing one long system prompt; each turn appends a user message
  and the previous answer to its history; turns arrive as a Poisson process at ``--rate`` per
  second (pick one near 70 % of what the replicas sustain), each to a conversation not in flight.
- ``no-reuse``: random prompts of the same length, at the same rate.

Per policy: TTFT p50/p90/p99 (streamed, to the first content chunk), completed requests per second,
requests shed (any non-200), and each replica's prefix-cache hit rate over the policy's run (from
the runtimes' own counters). The machine's load average is printed with the table: on a shared
machine the absolute figures move, the ratios between policies are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import KEY, MODEL, free_port, process, wait_http  # noqa: E402

POLICIES = ("least-loaded", "prefix-hash", "kv-events")
BLOCK_SIZE = 16
LOAD_WEIGHT_BLOCKS = [8.0]  # --load-weight-blocks


def runtime_command(
    model_dir: Path, work: Path, port: int, events: tuple[int, int], kv_bytes: int
) -> list[str]:
    config = work / f"runtime-{port}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": 2048},
                "max_concurrency": 16,
                "queue": {"max_length": 256, "timeout_ms": 60_000},
                "cpu_kv_cache_bytes": kv_bytes,
                "block_size": BLOCK_SIZE,
                "kv_events": {"enabled": True, "port": events[0], "replay_port": events[1]},
                "log_level": "warning",
                "device": "cpu",
                "cpu_threads": 1,
            }
        )
    )
    return [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config)] + [
        "--host", "127.0.0.1", "--port", str(port), "--model-dir", str(model_dir),
    ]  # fmt: skip


def gateway_command(
    policy: str, urls: list[str], events: dict[str, tuple[int, int]], model_dir: Path, work: Path, port: int
) -> list[str]:
    pool: dict[str, object] = {"name": MODEL, "replicas": urls}
    affinity = {"mode": "off" if policy == "least-loaded" else "prefix"}
    if policy == "kv-events":
        pool["kv_routing"] = {
            "tokenizer_dir": str(model_dir),
            "block_size": BLOCK_SIZE,
            "ports": events,
            "load_weight_blocks": LOAD_WEIGHT_BLOCKS[0],
        }
    config = work / f"gateway-{policy}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "host": "127.0.0.1",
                "port": port,
                "admin_port": free_port(),
                "models": [pool],
                "affinity": affinity,
                "retries": 0,
                "tenants": [
                    {
                        "name": "bench",
                        "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
                        "models": [MODEL],
                        "requests_per_minute": 10_000_000,
                        "tokens_per_minute": 10_000_000_000,
                        "max_concurrent_requests": 1024,
                        "priority": "interactive",
                    }
                ],
                "metering": {"uri": str(work / f"metering-{policy}.jsonl")},
            }
        )
    )
    return [sys.executable, "-m", "frontier_gateway", "serve", "--config", str(config)]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


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


async def run_workload(url: str, kind: str, args: argparse.Namespace, seed: int) -> dict[str, object]:
    rng = random.Random(seed)  # the words: each policy its own system prompt
    arrivals = random.Random(kind)  # the arrival times: the same for every policy
    system = words(rng, args.system_tokens // 2)  # ~2 tokens per word with the tiny tokenizer
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
                histories[i].append({"role": "user", "content": words(rng, args.user_tokens // 2)})
                messages = histories[i]
            else:
                messages = [
                    {"role": "user", "content": words(rng, (args.system_tokens + args.user_tokens) // 2)}
                ]
            status, ttft, text = await one_request(client, url, messages, args.max_tokens)
            results.append((status, ttft))
            if kind == "multi-turn":
                histories[i].append({"role": "assistant", "content": text})
                turns[i] += 1
                if turns[i] >= args.turns:  # a finished conversation starts over as a new one
                    histories[i] = [{"role": "system", "content": system}]
                    turns[i] = 0
            busy[i] = False

        started = time.monotonic()
        nxt = 0
        while time.monotonic() - started < args.duration_s:
            await asyncio.sleep(arrivals.expovariate(args.rate))
            idle = [j for j in range(args.conversations) if not busy[(nxt + j) % args.conversations]]
            if not idle:
                results.append((0, float("nan")))  # the client side had no idle conversation: counted shed
                continue
            i = (nxt + idle[0]) % args.conversations
            nxt = i + 1
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
    history = [{"role": "system", "content": words(rng, args.system_tokens // 2)}]
    for _ in range(args.turns):
        history += [
            {"role": "user", "content": words(rng, args.user_tokens // 2)},
            {"role": "assistant", "content": words(rng, args.max_tokens)},
        ]
    body = {"messages": history}
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        ids = tokens.for_body(body)
        assert ids is not None
        request_blocks(ids, BLOCK_SIZE)
    return (time.perf_counter() - start) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rate", type=float, default=2.0, help="turns per second (Poisson)")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--system-tokens", type=int, default=600)
    parser.add_argument("--user-tokens", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-mb", type=int, default=16, help="each replica's KV cache")
    parser.add_argument("--workloads", default="multi-turn,no-reuse")
    parser.add_argument("--load-weight-blocks", type=float, default=8.0, help="kv_routing.load_weight_blocks")
    args = parser.parse_args()
    LOAD_WEIGHT_BLOCKS[0] = args.load_weight_blocks
    from frontier_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_dir = make_tiny_checkpoint(work / "model", seed=0, max_position_embeddings=4096)
        print(
            f"gateway tokenization + block keys per request: {tokenize_cost(model_dir, args):.0f} us",
            flush=True,
        )
        ports = [free_port() for _ in range(args.replicas)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        events = {u: (free_port(), free_port()) for u in urls}
        procs = []
        for port, url in zip(ports, urls, strict=True):
            log = work / f"runtime-{port}.log"
            cmd = runtime_command(model_dir, work, port, events[url], args.kv_cache_mb * 1024 * 1024)
            procs.append((stack.enter_context(process(cmd, log, {"OMP_NUM_THREADS": "1"})), log, url))
        for proc, log, url in procs:
            wait_http(url + "/health/ready", proc, log)
        rows = []
        seed = 0
        for kind in args.workloads.split(","):
            for policy in POLICIES:
                seed += 1
                gport = free_port()
                glog = work / f"gateway-{policy}-{kind}.log"
                gproc = stack.enter_context(
                    process(gateway_command(policy, urls, events, model_dir, work, gport), glog)
                )
                gurl = f"http://127.0.0.1:{gport}"
                wait_http(gurl + "/health/ready", gproc, glog)
                time.sleep(1.0)  # the KV subscriptions connect
                before = prefix_counters(urls)
                result = asyncio.run(run_workload(gurl, kind, args, seed))
                after = prefix_counters(urls)
                hits = []
                for url in urls:
                    q = after[url][0] - before[url][0]
                    h = after[url][1] - before[url][1]
                    hits.append(h / q if q else float("nan"))
                gproc.terminate()
                gproc.wait(timeout=20)
                load = os.getloadavg()[0]
                rows.append((kind, policy, result, hits, load))
                p50, p90, p99 = result["ttft"]  # type: ignore[misc]
                print(
                    f"{kind:10s} {policy:12s} TTFT p50 {p50 * 1000:7.0f} ms  p90 {p90 * 1000:7.0f} ms  "
                    f"p99 {p99 * 1000:7.0f} ms  {result['rate']:5.2f} req/s  shed {result['shed']}/{result['sent']}  "
                    f"hit rate per replica {' '.join(f'{h:.2f}' for h in hits)}  load {load:.1f}",
                    flush=True,
                )
        print()
        print(
            "| workload | policy | TTFT p50 ms | p90 ms | p99 ms | req/s | shed | prefix hit rate per replica | load avg |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for kind, policy, result, hits, load in rows:
            p50, p90, p99 = result["ttft"]  # type: ignore[misc]
            print(
                f"| {kind} | {policy} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | {p99 * 1000:.0f} | "
                f"{result['rate']:.2f} | {result['shed']}/{result['sent']} | {' '.join(f'{h:.2f}' for h in hits)} | {load:.1f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
