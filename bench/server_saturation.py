"""The serving shell under saturation: how fast a refusal and a liveness probe answer while every
engine slot and queue place is taken, next to a served request's latency.

    .venv/bin/python bench/server_saturation.py [--model-dir DIR] [--concurrency 8] [--queue 8]

Starts the runtime on loopback (tiny model written on the fly unless --model-dir is given), fills
it with C + Q long streaming requests, then measures 429s and /health/live while it stays full.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml
from frontier_runtime.config import parse_config
from frontier_runtime.server.app import create_app
from frontier_runtime.server.serve import RuntimeServer, load_runtime, new_state, uvicorn_config


def _config(model_dir: Path, concurrency: int, queue: int):
    data = {
        "model": {"name": "tiny", "weights_uri": str(model_dir), "max_seq_len": 1024},
        "max_concurrency": concurrency,
        "queue": {"max_length": queue, "timeout_ms": 120_000},
        "batch": {"window_ms": 0, "max_batch_size": concurrency, "max_num_batched_tokens": 1024},
        "device": "cpu",
    }
    return parse_config(yaml.safe_dump(data))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(url: str, concurrency: int, queue: int, probes: int) -> None:
    body = {"prompt": "the", "max_tokens": 400, "ignore_eos": True, "stream": True}
    limits = httpx.Limits(max_connections=concurrency + queue + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def hold() -> float:
            start = time.perf_counter()
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for _ in r.aiter_raw():
                    pass
            return time.perf_counter() - start

        holders = [asyncio.create_task(hold()) for _ in range(concurrency + queue)]
        while True:
            text = (await client.get("/metrics")).text
            if f'frontier_queued_requests{{model_name="tiny"}} {float(queue)}' in text:
                break
            await asyncio.sleep(0.01)
        refusals, lives = [], []
        async with httpx.AsyncClient(base_url=url, timeout=30) as probe:
            for _ in range(probes):
                start = time.perf_counter()
                r = await probe.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
                refusals.append(time.perf_counter() - start)
                assert r.status_code == 429, r.status_code
                start = time.perf_counter()
                assert (await probe.get("/health/live")).status_code == 200
                lives.append(time.perf_counter() - start)
        served = await asyncio.gather(*holders)
    ms = 1000
    print(f"saturated with C={concurrency} running + Q={queue} queued streams of 400 tokens")
    print(
        f"429 refusal: p50 {statistics.median(refusals) * ms:.1f} ms  p99 {_pct(refusals, 0.99) * ms:.1f} ms  "
        f"({probes} probes)"
    )
    print(f"/health/live: p50 {statistics.median(lives) * ms:.1f} ms  p99 {_pct(lives, 0.99) * ms:.1f} ms")
    print(f"served stream end-to-end: p50 {statistics.median(served):.2f} s  max {max(served):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--queue", type=int, default=8)
    parser.add_argument("--probes", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from frontier_runtime.tiny import make_tiny_checkpoint

            model_dir = make_tiny_checkpoint(Path(tmp) / "tiny")
        config = _config(model_dir, args.concurrency, args.queue)
        state = new_state(config)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = RuntimeServer(
            uvicorn_config(create_app(state), "127.0.0.1", port), state, lambda: load_runtime(config, None)
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not state.health.ready()[0]:
            time.sleep(0.05)
        asyncio.run(_measure(f"http://127.0.0.1:{port}", args.concurrency, args.queue, args.probes))
        server.should_exit = True
        thread.join(30)


if __name__ == "__main__":
    main()
