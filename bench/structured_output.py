"""Structured output's cost to a batch: the same requests with and without JSON schemas, one run.

    python bench/structured_output.py [--model DIR] [--requests 32] [--rounds 3] [--threads 1]

One tiny model (the local stack's shape, written on the fly unless --model is given) and one engine.
Each round serves the same batch twice, back to back and in alternating order: once with no
constraint ("none"), once with a quarter of the requests carrying a JSON schema (nested object,
enums, an array, free strings) through ``response_format``'s path (``StructuredOutput`` →
llguidance masks filled while the model runs → one bitmask applied in the sampler). Every request
samples (temperature 1, its own seed) and ignores EOS, so the free-text ones produce exactly
``max_tokens``; a constrained one ends when its JSON is complete (its strings and arrays are
bounded, so even a random model completes it within the budget). So that both modes do the same
work, a first schema pass (also the warm-up) records each constrained request's output length,
and in "none" those requests get that length as ``max_tokens``: the same tokens in the same
batch shapes, the only difference being the constraint.

Throughput is output tokens per second of the whole batch. The ratio is the median over rounds of
each round's schema/none ratio: the two runs of a round are back to back, so on a shared machine
they see about the same disturbance, and the median drops the rounds where they did not. Wall time
on a shared machine still swings by tens of percent between runs, so two CPU-time ratios are
printed beside it, which other processes hardly move: the engine thread's own CPU time (the
critical path: the step, the sampler with its masks, the grammar's bookkeeping) and the whole
process's (which adds the helper thread that fills masks while the model runs). Also checked: every
constrained output that finished with "stop" parses and validates against its schema.
The last line is exactly
``ratio=<wall> engine_cpu_ratio=<r> process_cpu_ratio=<r> valid=<k>/<n>`` (schema/none throughput).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams, StructuredOutput
from frontier_runtime.tiny import make_tiny_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {
        "level": {"enum": ["debug", "info", "warning", "error"]},
        "service": {"type": "string", "maxLength": 16},
        "retry": {"type": "boolean"},
        "hosts": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "detail": {
            "type": "object",
            "properties": {
                "code": {"type": "integer", "minimum": 100, "maximum": 599},
                "message": {"type": "string", "maxLength": 24},
            },
            "required": ["code", "message"],
            "additionalProperties": False,
        },
    },
    "required": ["level", "service", "retry", "hosts", "detail"],
    "additionalProperties": False,
}
CONSTRAINT = StructuredOutput("json_schema", json.dumps(SCHEMA))


def make_batch(n: int, vocab: int, seed: int, max_tokens: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, vocab) for _ in range(rng.randint(16, 64))] for _ in range(n)]


def serve(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: list[int], constrained: set[int]
) -> tuple[float, int, list[tuple[str, str]], list[int], tuple[float, float]]:
    """Run the batch to completion: seconds, output tokens, (text, finish reason) of the constrained
    ones, each request's output length, and CPU seconds of (the engine thread, the process)."""
    ids = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(
            max_tokens=max_tokens[i],
            temperature=1.0,
            seed=i,
            ignore_eos=True,
            structured=CONSTRAINT if i in constrained else None,
        )
        rid = f"b{time.monotonic_ns()}-{i}"
        engine.add_request(rid, prompt, params)
        ids.append(rid)
    text = dict.fromkeys(ids, "")
    reason: dict[str, str] = {}
    lengths = dict.fromkeys(ids, 0)
    start = time.perf_counter()
    thread0, process0 = time.thread_time(), time.process_time()
    while engine.has_unfinished():
        for out in engine.step():
            lengths[out.request_id] += len(out.new_token_ids)
            text[out.request_id] += out.new_text
            if out.finished:
                reason[out.request_id] = out.finish_reason
    seconds = time.perf_counter() - start
    cpu = (time.thread_time() - thread0, time.process_time() - process0)
    outputs = [(text[ids[i]], reason[ids[i]]) for i in sorted(constrained)]
    return seconds, sum(lengths.values()), outputs, [lengths[rid] for rid in ids], cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="a model directory (default: a tiny random Llama)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_tiny_checkpoint(Path(tmp) / "tiny", seed=0)
        engine = LLMEngine(
            model_dir,
            max_batch_size=args.requests,
            max_num_batched_tokens=2048,
            cpu_kv_cache_bytes=256 << 20,
            prefix_caching=False,  # every round computes the same work
        )
        prompts = make_batch(args.requests, engine.model_config.vocab_size, args.seed, args.max_tokens)
        quarter = set(range(0, args.requests, 4))
        budget = [args.max_tokens] * args.requests
        _, _, outputs, lengths, _ = serve(engine, prompts, budget, quarter)  # warm-up, and the lengths
        same_work = [lengths[i] if i in quarter else args.max_tokens for i in range(args.requests)]
        best = {"none": 0.0, "schema": 0.0}
        ratios: dict[str, list[float]] = {"wall": [], "engine_cpu": [], "process_cpu": []}
        for r in range(args.rounds):
            rates, cpus = {}, {}
            order = ("none", "schema") if r % 2 == 0 else ("schema", "none")
            for mode in order:
                if mode == "schema":
                    seconds, tokens, constrained, _, cpu = serve(engine, prompts, budget, quarter)
                else:
                    seconds, tokens, constrained, _, cpu = serve(engine, prompts, same_work, set())
                rate = tokens / seconds
                rates[mode] = rate
                cpus[mode] = cpu
                best[mode] = max(best[mode], rate)
                outputs.extend(constrained)
                print(
                    f"round {r + 1} {mode:6s} {tokens:6d} tokens {seconds:6.2f} s {rate:8.1f} tok/s  "
                    f"CPU: engine thread {cpu[0]:6.2f} s, process {cpu[1]:6.2f} s",
                    flush=True,
                )
            ratios["wall"].append(rates["schema"] / rates["none"])
            ratios["engine_cpu"].append(cpus["none"][0] / cpus["schema"][0])
            ratios["process_cpu"].append(cpus["none"][1] / cpus["schema"][1])
            print(
                f"round {r + 1} ratios: wall {ratios['wall'][-1]:.3f}, engine CPU "
                f"{ratios['engine_cpu'][-1]:.3f}, process CPU {ratios['process_cpu'][-1]:.3f}",
                flush=True,
            )
        engine.shutdown()
    finished = [text for text, reason in outputs if reason == "stop"]
    valid = 0
    for text in finished:
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            print(f"INVALID: {text!r}", file=sys.stderr)
    ratio = {kind: statistics.median(values) for kind, values in ratios.items()}
    print(
        f"{args.requests} requests, {len(quarter)} with a JSON schema; best of {args.rounds} rounds: "
        f"none {best['none']:.1f} tok/s, schema {best['schema']:.1f} tok/s; medians of the rounds' ratios: "
        f"wall {ratio['wall']:.3f}, engine CPU {ratio['engine_cpu']:.3f}, process CPU {ratio['process_cpu']:.3f}"
    )
    print(f"constrained outputs: {len(outputs)}, finished with stop: {len(finished)}, valid: {valid}")
    print(
        f"ratio={ratio['wall']:.3f} engine_cpu_ratio={ratio['engine_cpu']:.3f} "
        f"process_cpu_ratio={ratio['process_cpu']:.3f} valid={valid}/{len(finished)}"
    )
    return 0 if valid == len(finished) else 1


if __name__ == "__main__":
    sys.exit(main())
