"""Pipeline parallelism with one step per stage in flight, against one step at a time, in one run.

    python bench/pipeline_overlap.py [--model llama-100m] [--rounds 3] [--requests 16] [--new 64]

Three engines on the same requests and the same CPU budget (``--threads``, split evenly over the
ranks): PP=1; PP=2 running one step at a time (rank 0 samples and schedules while both stages
idle, and each step fills and drains the pipeline); PP=2 with a step per stage in flight (the
engine's default: while the second stage finishes one step, the first runs the next). The middle
one is the same engine with ``steps_in_flight`` set to 1. Each runs in a fresh subprocess; the
three alternate round by round so a load change on a shared machine favours none. Greedy, EOS
ignored; tok/s = output tokens / seconds of ``generate`` (prefill included). Each row says whether
its outputs equal PP=1's token for token. The checkpoint is the engine benches' random
``llama-100m`` (``bench/engine_vs_vllm.py`` writes it). Nothing in CI runs this.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".frontier" / "bench-models"
RESULT = "BENCH-RESULT "
MODES = {
    "pp1": {"pipeline_parallel_size": 1, "steps_in_flight": 1},
    "pp2-one-step": {"pipeline_parallel_size": 2, "steps_in_flight": 1},
    "pp2-overlap": {"pipeline_parallel_size": 2, "steps_in_flight": 2},
}


def run_one(args: argparse.Namespace, mode: str) -> None:
    """In the subprocess: one engine, one timed generate; prints its result as JSON."""
    import torch
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.requests import SamplingParams

    settings = MODES[mode]
    engine = LLMEngine(
        MODELS / args.model,
        pipeline_parallel_size=settings["pipeline_parallel_size"],
        max_batch_size=args.requests,
        cpu_threads=args.threads,
        device="cpu",
    )
    torch.set_num_threads(engine.config.threads_per_rank)
    engine.steps_in_flight = settings["steps_in_flight"]
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 4000) for _ in range(args.prompt)] for _ in range(args.requests)]
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm
    started = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    engine.shutdown()
    tokens = sum(len(o) for o in outs)
    print(RESULT + json.dumps({"mode": mode, "tok_s": tokens / seconds, "outputs": outs}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-100m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--one", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args, args.one)
        return 0
    if not (MODELS / args.model / "config.json").is_file():
        print(f"no checkpoint at {MODELS / args.model}: run bench/engine_vs_vllm.py once to write it")
        return 2
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    outputs: dict[str, list] = {}
    for r in range(args.rounds):
        for mode in MODES:
            cmd = [sys.executable, __file__, "--one", mode]
            cmd += ["--model", args.model, "--requests", str(args.requests), "--prompt", str(args.prompt)]
            cmd += ["--new", str(args.new), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            line = next((x for x in done.stdout.splitlines() if x.startswith(RESULT)), None)
            if line is None:
                print(done.stdout[-2000:], done.stderr[-2000:])
                return 1
            result = json.loads(line[len(RESULT) :])
            rates[mode].append(result["tok_s"])
            outputs[mode] = result["outputs"]
            print(f"round {r + 1}/{args.rounds} {mode:>13}: {result['tok_s']:8.1f} tok/s", flush=True)
    base = statistics.median(rates["pp2-one-step"])
    print()
    print(
        f"{args.model}, {args.requests} requests x {args.new} tokens, {args.threads} threads, {args.rounds} rounds"
    )
    print("| engine | tok/s (median) | vs PP=2 one step at a time | outputs equal PP=1 |")
    print("|---|---|---|---|")
    for mode in MODES:
        median = statistics.median(rates[mode])
        same = outputs[mode] == outputs["pp1"]
        print(f"| {mode} | {median:.1f} | {median / base:.2f}x | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
