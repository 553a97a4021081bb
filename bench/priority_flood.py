"""Interactive latency under a flood of batch work: what the runtime's priority classes buy.

    .venv/bin/python bench/priority_flood.py [--rate R] [--duration 30] [--batch-clients 32]
                                             [--batch-requests 400] [--model-dir DIR]

One runtime process on loopback (the local stack's runtime settings and tiny model, one intra-op
thread) takes an interactive Poisson load at R req/s (default: the knee measured for the local
stack in stacks/baselines/local.json) of streaming requests, 32 prompt and 32 output tokens, in
three phases of --duration seconds each:

1. interactive alone;
2. the same load plus a batch flood: --batch-clients closed-loop clients sending --batch-requests
   requests (64 output tokens each) with ``priority: batch``; the batch work then runs to the end;
3. the same flood sent without a class (as interactive work), for comparison.

It prints a table, then one parseable line: the interactive p99 TTFT with the flood vs alone (goal:
within 10 %), and whether every batch request completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from frontier.capacity.baseline import load_baseline
from frontier.loadtest.client import Target, arrival_times, make_prompt, stream_request
from frontier.loadtest.stats import RequestSample
from frontier.targets import load_stack

MODEL = "tiny-llama"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _runtime_yaml(model_dir: Path) -> dict:
    """The local stack's runtime settings, as its hosts run them."""
    rt = load_stack("local").runtime
    return {
        "model": {"name": MODEL, "weights_uri": str(model_dir), "max_seq_len": 1024},
        "max_concurrency": rt.max_concurrency,
        # The flood is patient: it may wait far longer than interactive work.
        "queue": {**rt.queue.model_dump(), "batch_max_length": 256, "batch_timeout_ms": 600_000},
        "batch": rt.batch.model_dump(),
        "log_level": "warning",
        "device": "cpu",
        "cpu_threads": rt.cpu_threads or 1,
    }


def start_runtime(model_dir: Path, work: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    config = work / "runtime.yaml"
    config.write_text(yaml.safe_dump(_runtime_yaml(model_dir)))
    log = (work / "runtime.log").open("w")
    cmd = [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--model-dir", str(model_dir)]
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(url + "/health/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"runtime did not start: {(work / 'runtime.log').read_text()[-2000:]}")
        time.sleep(0.2)


@dataclass
class Phase:
    name: str
    interactive: list[RequestSample] = field(default_factory=list)
    batch_sent: int = 0
    batch_ok: int = 0
    batch_failed: int = 0
    batch_tokens: int = 0
    batch_done_s: float = 0.0  # from the start of the phase until the last batch request ended

    def ttft_ms(self, q: float) -> float:
        values = [s.ttft_s * 1000 for s in self.interactive if s.ok and s.ttft_s is not None]
        return float(np.percentile(values, q)) if values else float("nan")

    def tpot_ms(self, q: float) -> float:
        values = [
            (s.e2el_s - s.ttft_s) / (s.output_tokens - 1) * 1000
            for s in self.interactive
            if s.ok and s.output_tokens > 1 and s.ttft_s is not None and s.e2el_s is not None
        ]
        return float(np.percentile(values, q)) if values else float("nan")

    @property
    def failed(self) -> int:
        return sum(not s.ok for s in self.interactive)


async def _interactive(url: str, rate: float, duration: float, seed: int) -> list[RequestSample]:
    rng = np.random.default_rng(seed)
    target = Target(url, MODEL, prompt_tokens=32, max_tokens=32, timeout_s=120)
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as client:
        tasks = []
        for offset in arrival_times(rate, duration, rng):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(stream_request(client, target, make_prompt(rng, 24))))
        return list(await asyncio.gather(*tasks))


async def _batch(url: str, phase: Phase, clients: int, total: int, priority: str | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    prompts = [make_prompt(rng, 24) for _ in range(total)]
    started = time.perf_counter()
    extra = {"priority": priority} if priority else {}

    async def client_loop(client: httpx.AsyncClient) -> None:
        while prompts:
            body = {"model": MODEL, "prompt": prompts.pop(), "max_tokens": 64, "ignore_eos": True, **extra}
            phase.batch_sent += 1
            for _attempt in range(20):
                try:
                    answer = await client.post(url + "/v1/completions", json=body)
                except httpx.HTTPError:
                    await asyncio.sleep(0.5)
                    continue
                if answer.status_code in (429, 503):
                    await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
                    continue
                break
            else:
                answer = None
            if answer is not None and answer.status_code == 200:
                phase.batch_ok += 1
                phase.batch_tokens += answer.json()["usage"]["completion_tokens"]
            else:
                phase.batch_failed += 1

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    phase.batch_done_s = time.perf_counter() - started


async def run_phase(
    name: str, url: str, args: argparse.Namespace, priority: str | None, flood: bool
) -> Phase:
    phase = Phase(name)
    batch = (
        asyncio.create_task(_batch(url, phase, args.batch_clients, args.batch_requests, priority, 1))
        if flood
        else None
    )
    if flood:
        await asyncio.sleep(2.0)  # the flood fills the engine before interactive load starts
    phase.interactive = await _interactive(url, args.rate, args.duration, seed=7)
    if batch is not None:
        await batch
    return phase


def _quiet(url: str) -> None:
    """Until the runtime holds no request (so phases do not overlap)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=5).text
        busy = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{"))
        )
        if busy == 0:
            return
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rate", type=float, help="interactive req/s (default: the local stack's measured knee)"
    )
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of interactive load per phase")
    parser.add_argument("--batch-clients", type=int, default=32)
    parser.add_argument("--batch-requests", type=int, default=400)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--no-compare", action="store_true", help="skip phase 3 (the flood without a class)")
    args = parser.parse_args()
    if args.rate is None:
        baseline = load_baseline("local")
        args.rate = baseline.replica_qps if baseline else 8.0
    console = Console(width=160)
    with tempfile.TemporaryDirectory(prefix="priority-flood-") as tmp:
        work = Path(tmp)
        model_dir = args.model_dir
        if model_dir is None:
            from frontier_runtime.tiny import make_tiny_checkpoint

            model_dir = make_tiny_checkpoint(work / "tiny-llama", seed=0)
        proc, url = start_runtime(model_dir, work)
        try:
            phases = [asyncio.run(run_phase("interactive alone", url, args, None, flood=False))]
            _quiet(url)
            phases.append(
                asyncio.run(run_phase("+ batch flood (priority: batch)", url, args, "batch", flood=True))
            )
            if not args.no_compare:
                _quiet(url)
                phases.append(asyncio.run(run_phase("+ same flood, no class", url, args, None, flood=True)))
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    table = Table(
        title=f"interactive {args.rate:g} req/s for {args.duration:g} s per phase; flood: {args.batch_clients} clients x {args.batch_requests} requests of 64 tokens"
    )
    for column in (
        "phase",
        "sent",
        "failed",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "batch done",
        "batch tok/s",
        "batch all done s",
    ):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for p in phases:
        flood = p.batch_sent > 0
        table.add_row(
            p.name,
            str(len(p.interactive)),
            str(p.failed),
            f"{p.ttft_ms(50):,.0f}",
            f"{p.ttft_ms(99):,.0f}",
            f"{p.tpot_ms(50):,.1f}",
            f"{p.batch_ok}/{args.batch_requests}" if flood else "",
            f"{p.batch_tokens / p.batch_done_s:,.0f}" if flood else "",
            f"{p.batch_done_s:,.1f}" if flood else "",
        )
    console.print(table)
    alone, flood = phases[0], phases[1]
    ratio = flood.ttft_ms(99) / alone.ttft_ms(99)
    summary = {
        "rate": args.rate,
        "ttft_p99_alone_ms": round(alone.ttft_ms(99), 1),
        "ttft_p99_flood_ms": round(flood.ttft_ms(99), 1),
        "ratio": round(ratio, 3),
        "within_10pct": ratio <= 1.10,
        "batch_completed": flood.batch_ok,
        "batch_requests": args.batch_requests,
        "interactive_failed": flood.failed,
    }
    if len(phases) > 2:
        summary["ttft_p99_no_class_ms"] = round(phases[2].ttft_ms(99), 1)
    print("priority_flood: " + " ".join(f"{k}={json.dumps(v)}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
