"""What splitting prefill from decode does to running streams while long prompts arrive.

    .venv/bin/python bench/disaggregation.py [--streams 4] [--long-tokens 900] [--long-every-s 0.5]
                                             [--duration-s 30] [--cores 2] [--refresh-cpu]
                                             [--planner-cpu-threads N]

The tiny model (hidden 256, 4 layers) behind one gateway process, on the same total cores, twice:

- ``colocated``: one runtime with ``--cores`` intra-op threads serves everything;
- ``1P+1D``: a prefill runtime and a decode runtime (``kv_transfer.role``), ``--cores / 2``
  threads each; the gateway's two hops move every prompt's KV from the prefill to the decode.

The load, the same in both: ``--streams`` clients each stream completions of a 64-token prompt and
128 tokens one after another; meanwhile a ``--long-tokens`` prompt (4 tokens of answer) arrives
every ``--long-every-s``. Printed per layout: the inter-token latency p50/p99/max of the streams
(gaps between content chunks of one stream, after its first), their tokens per second, the long
prompts' latency p50/p99 and requests refused. Beside each measured figure, after the slash, the
planner's prediction for the same load (``frontier.capacity.disaggregation``: roofline steps on
this machine's CPU as its micro-benchmark measured it at the layout's threads (cached; one thread
is timed on its CPU clock, several by the wall clock, which other jobs move), the share of a
stream's gaps that carry a long prompt, the KV transfer at the rate ``bench/kv_transfer_rate.py``
measured); the model leaves out HTTP, the gateway's hops and the streams' own short prompts. On a
shared machine the absolute figures move; the ratios between the two layouts are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_overhead import KEY, MODEL, free_port, gateway_serving, process, wait_http  # noqa: E402
from gateway_overhead import runtime_command as serving  # noqa: E402

BLOCK_SIZE = 16
STREAM_PROMPT, STREAM_TOKENS, LONG_ANSWER = 64, 128, 4


def runtime_command(model_dir: Path, work: Path, port: int, threads: int, kv_transfer: dict) -> list[str]:
    """A replica on ``threads`` cores in ``kv_transfer``'s role (``{}``: colocated)."""
    return serving(
        model_dir,
        work,
        port,
        max_seq_len=1024,
        max_concurrency=16,
        queue={"max_length": 256, "timeout_ms": 120_000},
        block_size=BLOCK_SIZE,
        cpu_threads=threads,
        kv_transfer=kv_transfer,
    )


def gateway_command(pool: dict[str, object], work: Path, name: str, port: int) -> list[str]:
    return gateway_serving([pool], work, name, port, retries=0, probe={"interval_s": 1.0, "timeout_s": 1.0})


class Tally:
    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.tokens = 0
        self.long_latency: list[float] = []
        self.refused = 0


def greedy(rng: random.Random, prompt_tokens: int, max_tokens: int, **fields: object) -> dict[str, object]:
    """A greedy completion of a random prompt that answers exactly ``max_tokens`` tokens."""
    return {
        "model": MODEL,
        "prompt": [rng.randrange(1, 4000) for _ in range(prompt_tokens)],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **fields,
    }


async def stream_loop(client: httpx.AsyncClient, url: str, seed: int, until: float, tally: Tally) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        body = greedy(rng, STREAM_PROMPT, STREAM_TOKENS, stream=True)
        last = None
        async with client.stream("POST", url + "/v1/completions", json=body) as answer:
            if answer.status_code != 200:
                await answer.aread()
                tally.refused += 1
                continue
            async for line in answer.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if not any(c.get("text") for c in json.loads(line[6:]).get("choices", [])):
                    continue
                now = time.monotonic()
                if last is not None and time.monotonic() < until:
                    tally.gaps.append(now - last)
                last = now
                tally.tokens += 1


async def long_prompts(
    client: httpx.AsyncClient, url: str, tokens: int, every_s: float, until: float, tally: Tally
) -> None:
    rng = random.Random(7)
    pending = []

    async def one() -> None:
        body = greedy(rng, tokens, LONG_ANSWER)
        start = time.monotonic()
        answer = await client.post(url + "/v1/completions", json=body)
        if answer.status_code == 200:
            tally.long_latency.append(time.monotonic() - start)
        else:
            tally.refused += 1

    while time.monotonic() < until:
        pending.append(asyncio.create_task(one()))
        await asyncio.sleep(every_s)
    await asyncio.gather(*pending)


async def drive(url: str, args: argparse.Namespace) -> Tally:
    tally = Tally()
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        headers=headers, timeout=300, limits=httpx.Limits(max_connections=256)
    ) as client:
        # Warm both paths (first requests pay for lazy initialisation) before measuring.
        warm = Tally()
        await asyncio.gather(
            stream_loop(client, url, 99, time.monotonic() + 1.0, warm),
            long_prompts(client, url, args.long_tokens, 0.5, time.monotonic() + 1.0, warm),
        )
        until = time.monotonic() + args.duration_s
        await asyncio.gather(
            *(stream_loop(client, url, i, until, tally) for i in range(args.streams)),
            long_prompts(client, url, args.long_tokens, args.long_every_s, until, tally),
        )
    return tally


def run_layout(name: str, model_dir: Path, work: Path, args: argparse.Namespace) -> Tally:
    with ExitStack() as stack:
        pool: dict[str, object] = {"name": MODEL}
        procs = []
        if name == "colocated":
            port = free_port()
            cmd = runtime_command(model_dir, work, port, args.cores, {})
            procs.append((port, stack.enter_context(process(cmd, work / f"{name}-runtime.log"))))
            pool["replicas"] = [f"http://127.0.0.1:{port}"]
        else:
            half = max(1, args.cores // 2)
            roles = {
                "prefill": {"role": "prefill", "host": "127.0.0.1", "port": free_port()},
                "decode": {"role": "decode"},
            }
            urls: dict[str, list[str]] = {}
            for role, kv in roles.items():
                port = free_port()
                cmd = runtime_command(model_dir, work, port, half, kv)
                procs.append((port, stack.enter_context(process(cmd, work / f"{name}-{role}.log"))))
                urls[role] = [f"http://127.0.0.1:{port}"]
            pool["disaggregation"] = urls
        for port, proc in procs:
            wait_http(f"http://127.0.0.1:{port}/health/ready", proc, work / f"{name}.log")
        gw_port = free_port()
        gw_log = work / f"{name}-gateway.log"
        gw = stack.enter_context(process(gateway_command(pool, work, name, gw_port), gw_log))
        wait_http(f"http://127.0.0.1:{gw_port}/health/ready", gw, gw_log)
        return asyncio.run(drive(f"http://127.0.0.1:{gw_port}", args))


@dataclass(frozen=True)
class Predicted:
    itl_p50_ms: float
    itl_p99_ms: float
    long_ms: float  # a long prompt's request, its answer included


def predict(model_dir: Path, args: argparse.Namespace) -> dict[str, Predicted]:
    """The planner's figures for both layouts under this load (means and the gap mix; no HTTP)."""
    from frontier.capacity.cpu import replica_of_config
    from frontier.capacity.devices import cpu_device
    from frontier.capacity.disaggregation import (
        colocated_chunk,
        decode_interference,
        interference,
        measured_tcp,
        prefill_only,
        prompt_tail,
    )

    # The tiny model in float32, as the runtime loads it here, with the runtime's defaults the bench
    # runs with: 16 sequences, 1,024 tokens a step, chunked prefill.
    cfg = json.loads((model_dir / "config.json").read_text())
    replica = dataclasses.replace(replica_of_config(cfg, max_batch=16), max_num_batched_tokens=1024)
    per_token = replica.kv_bytes_per_token_per_gpu
    context = STREAM_PROMPT + STREAM_TOKENS / 2
    arrivals = 1 / args.long_every_s
    long_tokens = args.long_tokens

    threads = args.planner_cpu_threads or args.cores
    device, eff = cpu_device(threads, 2 * 1024**3, refresh=args.refresh_cpu)
    chunk = colocated_chunk(replica, long_tokens, args.streams + 1)
    chunks = -(-long_tokens // chunk)
    # The long prompt runs beside the streams (it is not one of them).
    co = interference(
        device, eff, replica, streams=args.streams, context=context, chunk=chunk, chunks_per_prompt=chunks,
        attended=long_tokens / 2, prompts_per_s=arrivals, joining=False,
    )  # fmt: skip
    colocated = Predicted(
        co.p50_s * 1e3, co.p99_s * 1e3, (chunks * co.mixed_s + (LONG_ANSWER - 1) * co.mean_s) * 1e3
    )

    half_threads = min(threads, max(1, args.cores // 2))
    half, half_eff = cpu_device(half_threads, 2 * 1024**3, refresh=args.refresh_cpu)
    de = decode_interference(
        half, half_eff, replica, long_tokens, BLOCK_SIZE, args.streams, context, arrivals
    )
    moved = (long_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE * per_token
    transfer = measured_tcp(BLOCK_SIZE * per_token).seconds(moved)
    prefill = prefill_only(half, half_eff, replica, long_tokens).alone_s
    tail = prompt_tail(long_tokens, BLOCK_SIZE)
    assert tail <= BLOCK_SIZE
    split = Predicted(
        de.p50_s * 1e3,
        de.p99_s * 1e3,
        (prefill + transfer + de.mixed_s + (LONG_ANSWER - 1) * de.mean_s) * 1e3,
    )
    print(f"planner: colocated on {device.name}, each P/D half on {half.name}")
    print(
        f"planner: colocated: a step carrying the {long_tokens}-token prompt {co.mixed_s * 1e3:.1f} ms, a plain "
        f"step {co.plain_s * 1e3:.1f} ms, stalled gaps {co.mixed_share:.2%} of a stream's (p99 is the stall "
        f"from 1 %); 1P+1D: the tail step {de.mixed_s * 1e3:.1f} ms, prefill {prefill * 1e3:.1f} ms, "
        f"transfer {transfer * 1e3:.1f} ms ({moved / 1e6:.1f} MB)"
    )
    for d in dict.fromkeys((device, half)):
        print(f"planner: {d.name}: {d.source}")
    return {"colocated": colocated, "1P+1D": split}


def row(name: str, tally: Tally, duration_s: float, planned: Predicted) -> str:
    gaps = np.array(tally.gaps) * 1000 if tally.gaps else np.array([float("nan")])
    longs = np.array(tally.long_latency) * 1000 if tally.long_latency else np.array([float("nan")])
    return (
        f"| {name} | {np.percentile(gaps, 50):.1f} / {planned.itl_p50_ms:.1f} "
        f"| {np.percentile(gaps, 99):.1f} / {planned.itl_p99_ms:.1f} | {gaps.max():.1f} "
        f"| {tally.tokens / duration_s:.0f} | {np.percentile(longs, 50):.0f} / {planned.long_ms:.0f} "
        f"| {np.percentile(longs, 99):.0f} | {len(tally.long_latency)} | {tally.refused} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=900)
    parser.add_argument("--long-every-s", type=float, default=0.5)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument(
        "--refresh-cpu",
        action="store_true",
        help="measure the CPU again for the planner's figures instead of using the cached measurement",
    )
    parser.add_argument(
        "--planner-cpu-threads",
        type=int,
        default=0,
        help="model every runtime on the CPU measured at this many threads (default: each layout's own); "
        "1 where other jobs share the machine: one thread is timed on its CPU clock, several by the wall clock",
    )
    args = parser.parse_args()
    if not 0 <= args.planner_cpu_threads <= args.cores:
        parser.error(
            f"--planner-cpu-threads {args.planner_cpu_threads}: must lie in 0 .. --cores ({args.cores})"
        )
    from frontier_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory(prefix="bench-pd-") as tmp:
        work = Path(tmp)
        model_dir = make_tiny_checkpoint(work / "model", seed=0)
        # Before the runtimes start: the CPU micro-benchmark (cached) needs the cores to itself.
        planned = predict(model_dir, args)
        results = {name: run_layout(name, model_dir, work, args) for name in ("colocated", "1P+1D")}
    print(
        f"\n{args.streams} streams of {STREAM_PROMPT}+{STREAM_TOKENS} tokens, a {args.long_tokens}-token prompt "
        f"every {args.long_every_s} s, {args.duration_s:.0f} s, {args.cores} cores in both layouts "
        f"(load average {os.getloadavg()[0]:.1f})\n"
    )
    print(
        "| layout | ITL p50 ms (measured / planner) | ITL p99 ms (measured / planner) | ITL max ms "
        "| stream tok/s | long p50 ms (measured / planner) | long p99 ms | long done | refused |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, tally in results.items():
        print(row(name, tally, args.duration_s, planned[name]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
