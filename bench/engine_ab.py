"""Engine throughput of two runtime checkouts, interleaved in one run (a before/after check).

    python bench/engine_ab.py --a /path/to/old/runtime --b runtime [--rounds 3] [--requests 64]

Each round runs the same requests (mixed prompt and output lengths, greedy, EOS ignored) on the
same tiny checkpoint through ``LLMEngine`` of checkout A, then of checkout B, each in a fresh
subprocess with the same thread count. Interleaving spreads a busy machine's noise over both.
Prints one row per run and, last, ``a_tok_s=<median> b_tok_s=<median> b_over_a=<ratio>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, random, sys, time
import torch
from frontier_runtime.requests import SamplingParams
from frontier_runtime.engine.llm_engine import LLMEngine
model, requests, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
rng = random.Random(0)
work = [([rng.randrange(5, 4000) for _ in range(rng.randrange(8, 96))], rng.randrange(8, 64)) for _ in range(requests)]
engine = LLMEngine(model, dtype="float32", max_batch_size=32, max_num_batched_tokens=1024)
engine.generate([[1, 2, 3]], [SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)])
start = time.perf_counter()
outs = engine.generate([p for p, _ in work], [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in work])
elapsed = time.perf_counter() - start
tokens = sum(len(o) for o in outs)
print(json.dumps({"tokens": tokens, "seconds": elapsed}))
"""


def run(runtime: Path, model: Path, requests: int, threads: int) -> float:
    env = {"PYTHONPATH": str(runtime.resolve()), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(requests), str(threads)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["tokens"] / result["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="runtime/ folder of the first checkout")
    parser.add_argument("--b", type=Path, default=Path("runtime"), help="runtime/ folder of the second")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, str(args.b.resolve()))
    from frontier_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny"
        make_tiny_checkpoint(model)
        a, b = [], []
        for i in range(args.rounds):
            a.append(run(args.a, model, args.requests, args.threads))
            b.append(run(args.b, model, args.requests, args.threads))
            print(f"round {i + 1}: A {a[-1]:8.1f} tok/s   B {b[-1]:8.1f} tok/s", flush=True)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"a_tok_s={ma:.1f} b_tok_s={mb:.1f} b_over_a={mb / ma:.3f}")


if __name__ == "__main__":
    main()
