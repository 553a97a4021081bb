"""Host work per decode step of Frontier's engine: what the device waits for while Python runs.

    python bench/host_overhead.py [--streams 64] [--tokens 96] [--reps 3] [--threads 1] [--async]

One tiny random Llama (``frontier_runtime.tiny``, 2 layers of width 64, written on the fly) so
the forward is small and the host's share shows. ``--streams`` greedy requests with EOS ignored
run together through ``LLMEngine`` (text on, stop strings set, so detokenization and the stop
search run as a served request's do); only steps where every stream decodes are counted. Each
phase is timed with ``time.perf_counter`` around the engine's own calls:

  schedule   ``Scheduler.schedule``
  prepare    ``ModelRunner.prepare`` (the step's inputs from the scheduled sequences)
  forward    ``ModelRunner.launch`` + ``ModelRunner.collect`` (the model; on a GPU, the wait)
  sample     ``Sampler.__call__`` (the logits to token ids on the host)
  emit       appending tokens, finish checks, ``RequestOutput`` building (``_collect`` less sample)
  detok      ``OutputProcessor`` text deltas and stop strings
  other      the rest of ``LLMEngine.step``

Host µs per step = step time − forward. By default every figure is the timed thread's CPU time
(``time.thread_time``; with one torch thread the forward runs on the step thread, so it is counted
there too): on a shared, loaded machine wall time also holds the time the thread waited for a
core, which swings run to run by more than the differences measured. ``--clock wall`` times with
``time.perf_counter`` instead. Inline (the default, ``LLMEngine`` as offline use
drives it) every phase is on the step's critical path. With ``--async`` the run goes through
``AsyncEngine``, whose output thread detokenizes while the engine thread runs the next step:
the detok column is then that thread's work, and "hidden" is the share of all host work done
off the step thread (work a GPU would not wait for). Each repetition is a fresh engine; the
table shows each phase's median over the repetitions, and the last line is exactly
``host_us_per_step=<median> hidden_share=<fraction>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "runtime"))

import torch  # noqa: E402
from frontier_runtime.engine.llm_engine import LLMEngine  # noqa: E402
from frontier_runtime.engine.loop import AsyncEngine  # noqa: E402
from frontier_runtime.requests import SamplingParams  # noqa: E402
from frontier_runtime.tiny import make_tiny_checkpoint  # noqa: E402

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
CLOCK: list[Callable[[], float]] = [time.thread_time]
PHASES = ("schedule", "prepare", "forward", "sample", "emit", "detok", "other")


class Timers:
    """Per-step phase totals, filled by wrappers around the engine's methods (this thread only
    for the step phases; the output thread's detok lands in ``off_thread``)."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.off_thread = 0.0
        self.step_thread: int | None = None

    def wrap(self, obj: Any, name: str, phase: str) -> None:
        inner: Callable[..., Any] = getattr(obj, name)
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = CLOCK[0]()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = CLOCK[0]() - start
                if threading.get_ident() == timers.step_thread:
                    timers.step[phase] += spent
                else:
                    timers.off_thread += spent

        setattr(obj, name, timed)


def instrument(engine: LLMEngine, timers: Timers, processor: Any) -> None:
    timers.wrap(engine.scheduler, "schedule", "schedule")
    timers.wrap(engine.runner, "prepare", "prepare")
    timers.wrap(engine.runner, "launch", "forward")
    timers.wrap(engine.runner, "collect", "forward")
    timers.wrap(engine, "sampler", "sample")
    timers.wrap(engine, "_collect", "collect")  # emit = collect - sample - its forward wait
    timers.wrap(processor, "process", "detok")
    step = engine.step

    def timed_step() -> Any:
        timers.step_thread = threading.get_ident()
        timers.step.clear()
        batch_before = engine.scheduler.running[:]
        start = CLOCK[0]()
        out = step()
        wall = CLOCK[0]() - start
        row = dict(timers.step)
        row["wall"] = wall
        # Decode-only steps of the full batch: every stream was running before and is after.
        row["decode"] = float(
            len(batch_before) == len(engine.scheduler.running) == engine._last_batch == engine._last_tokens
        )
        timers.steps.append(row)
        return out

    engine.step = timed_step  # type: ignore[method-assign]


def summarize(rows: list[dict[str, float]], streams: int, off_thread_us: float) -> dict[str, float]:
    """Mean µs per decode step of each phase (the collect wrapper's time split into its parts)."""
    decode = [r for r in rows if r["decode"] and r["wall"] > 0]
    n = len(decode)
    if not n:
        raise SystemExit("no full-batch decode steps were seen: raise --tokens")
    us: dict[str, float] = {}
    for phase in ("schedule", "prepare", "forward", "sample", "detok"):
        us[phase] = sum(r.get(phase, 0.0) for r in decode) / n * 1e6
    # _collect holds collect()'s forward wait (already in forward) and the sampler.
    collect = sum(r.get("collect", 0.0) for r in decode) / n * 1e6
    collect_forward = 0.0  # on CPU launch runs the model; collect returns at once
    us["emit"] = max(0.0, collect - us["sample"] - collect_forward)
    wall = sum(r["wall"] for r in decode) / n * 1e6
    us["other"] = max(0.0, wall - sum(us[p] for p in PHASES if p != "other"))
    us["wall"] = wall
    us["host"] = wall - us["forward"]
    us["off_thread"] = off_thread_us
    us["steps"] = n
    return us


def run_once(model_dir: Path, streams: int, tokens: int, use_async: bool) -> dict[str, float]:
    engine = LLMEngine(
        model_dir,
        max_batch_size=streams,
        max_num_batched_tokens=max(2048, streams * 32),
        cpu_kv_cache_bytes=64 << 20,
        prefix_caching=False,
    )
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    timers = Timers()
    # Stop strings that never occur (so every stream runs its full length) but are searched for.
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, stop=("\x00\x01never",))
    prompts = [[8 + (i * 7 + j) % 200 for j in range(16)] for i in range(streams)]
    if not use_async:
        instrument(engine, timers, engine.outputs)
        engine.generate(prompts, params)
        engine.shutdown()
        return summarize(timers.steps, streams, 0.0)
    loop = AsyncEngine(engine)
    try:
        instrument(engine, timers, loop._text)
        futures = [
            loop.call(lambda e: None)  # make sure instrumenting happened on the loop thread's engine
        ]
        futures[0].result(timeout=60)
        from frontier_runtime.engine.loop import _SyncSink

        sinks = []
        for i, prompt in enumerate(prompts):
            sink = _SyncSink()
            loop._enqueue(f"r{i}", prompt, params, sink)
            sinks.append(sink)
        for sink in sinks:
            if not sink.done.wait(600):
                raise SystemExit("a stream did not finish")
        steps = [r for r in timers.steps if r["decode"]]
        off = timers.off_thread / max(1, len(steps)) * 1e6
    finally:
        loop.shutdown()
    return summarize(timers.steps, streams, off)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=96, help="output tokens per stream")
    parser.add_argument("--reps", type=int, default=3, help="fresh engines; the table shows medians")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--async", dest="use_async", action="store_true", help="through AsyncEngine")
    parser.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="thread CPU time or wall time"
    )
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint dir (default: a tiny one)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.thread_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_tiny_checkpoint(Path(tmp) / "tiny", seed=0, **SHAPE)
        runs = [run_once(model_dir, args.streams, args.tokens, args.use_async) for _ in range(args.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    mode = "AsyncEngine (detok on the output thread)" if args.use_async else "LLMEngine, inline"
    print(
        f"{args.streams} streams, {args.tokens} tokens each, {mode}, {args.threads} thread(s), "
        f"{args.clock} clock, median of {args.reps} runs, {int(med['steps'])} decode steps each"
    )
    print(f"{'phase':<10} {'us/step':>9} {'us/token':>9}")
    for phase in PHASES:
        where = " (output thread)" if args.use_async and phase == "detok" else ""
        value = med["off_thread"] if args.use_async and phase == "detok" else med[phase]
        print(f"{phase:<10} {value:9.1f} {value / args.streams:9.2f}{where}")
    print(f"{'step':<10} {med['wall']:9.1f}")
    host_on_path = med["host"]
    total_host = host_on_path + med["off_thread"]
    hidden = med["off_thread"] / total_host if total_host else 0.0
    print(f"{'host':<10} {host_on_path:9.1f}   (step - forward: on the critical path)")
    per_run = ", ".join(f"{r['host']:.0f}" for r in runs)
    print(f"per run host us/step: {per_run}")
    print(f"host_us_per_step={host_on_path:.1f} hidden_share={hidden:.2f}")


if __name__ == "__main__":
    main()
