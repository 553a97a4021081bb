"""Where a Frontier engine run's time goes: wall time by step kind, linears by rows, attention.

    python bench/engine_profile.py [--model llama-100m] [--dtype float32] [--threads 2] [--ops]

Runs the 64 requests of ``bench/engine_vs_vllm.py`` (same checkpoint, same settings) through
``LLMEngine`` alone. Each ``ModelRunner.launch`` (the forward the engine's step calls) is timed
and filed under its step kind (prefill, decode of more than 16 sequences, decode of at most 16);
with ``--ops`` each linear layer is
timed too, filed by the rows it multiplies (with its GFLOPS), and each attention call. Timers
wrap the calls with ``time.perf_counter``: no profiler hooks in the kernels, so the figures are
the run's own (the ``--ops`` timers add a few microseconds per call). One table, biggest first.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "runtime"))

import engine_vs_vllm as bench  # noqa: E402  (the workload and the checkpoints)

ROW_BUCKETS = ((1, 8), (9, 16), (17, 32), (33, 64), (65, 127))


def rows_bucket(rows: int) -> str:
    """The label a linear of ``rows`` rows is filed under."""
    for low, high in ROW_BUCKETS:
        if rows <= high:
            return f"linear, {low}-{high} rows"
    return "linear, >= 128 rows"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-100m", choices=sorted(bench.SHAPES))
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ops", action="store_true", help="time each linear and attention call too")
    args = parser.parse_args()

    from frontier_runtime.engine import model_runner
    from frontier_runtime.models.llama import layers
    from frontier_runtime.ops.attention import AttentionBackend
    from frontier_runtime.requests import SamplingParams

    model = bench.ensure_model(args.model)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    requests = bench.make_requests(64, vocab, 0)
    engine = bench.frontier_engine(str(model), args.dtype, args.threads)

    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    flops: collections.Counter[str] = collections.Counter()

    def timed(key: str, fn, *a, **kw):
        start = time.perf_counter()
        out = fn(*a, **kw)
        seconds[key] += time.perf_counter() - start
        calls[key] += 1
        return out

    # What the engine's step calls: launch (the forward; on CPU all of it) then collect.
    launch = model_runner.ModelRunner.launch

    def launch_timed(self, step):
        kind = "prefill" if not step.is_decode_only else "decode, > 16 sequences"
        if step.is_decode_only and len(step.rows) <= 16:
            kind = "decode, <= 16 sequences"
        return timed(f"step: {kind}", launch, self, step)

    model_runner.ModelRunner.launch = launch_timed
    if args.ops:
        forward = layers.Linear.forward

        def linear_timed(self, x):
            rows = x.numel() // x.shape[-1]
            key = rows_bucket(rows)
            flops[key] += 2 * rows * self.in_features * self.out_features
            return timed(key, forward, self, x)

        layers.Linear.forward = linear_timed
        attend = AttentionBackend.attend.__func__  # every backend's, through the base class
        AttentionBackend.attend = classmethod(lambda cls, *a, **kw: timed("attention", attend, cls, *a, **kw))

    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    engine.generate([p for p, _ in requests], params)
    wall = time.perf_counter() - start
    engine.shutdown()

    print(f"{args.model} {args.dtype}, {args.threads} threads: {wall:.2f} s for 64 requests")
    print(f"  {'part':<30} {'seconds':>8} {'calls':>7} {'GFLOPS':>7}")
    for key in sorted(seconds, key=lambda k: (not k.startswith("step"), -seconds[k])):
        rate = f"{flops[key] / seconds[key] / 1e9:7.0f}" if flops[key] else ""
        print(f"  {key:<30} {seconds[key]:8.2f} {calls[key]:7d} {rate:>7}")


if __name__ == "__main__":
    main()
