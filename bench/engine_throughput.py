"""Offline throughput of Frontier's engine against Hugging Face transformers, side by side.

    python bench/engine_throughput.py [--model DIR] [--requests 64] [--seed 0]

One run, one tiny model (written on the fly unless --model is given), the same 64 requests of
mixed prompt and output lengths (greedy, EOS ignored so every request produces exactly its
``max_tokens``) served three ways:

  engine      all requests submitted at once to ``LLMEngine`` (continuous batching, paged KV);
              run before and after the other two, timed as the mean of both runs
  sequential  transformers ``generate`` one request at a time (no padding)
  static      transformers ``generate`` in static batches of 16, padded left; a batch runs until
              its longest request is done, and only each request's own tokens count

All three run with the same number of torch intra-op threads: every core by default (torch's
own default). On a machine busy with other work an OpenMP barrier that waits for a descheduled
thread costs milliseconds, so there ``--threads 1`` gives steadier figures for all three.

Prints output tokens/s of each and the two ratios; the last line is exactly
``vs_sequential=<ratio> vs_static=<ratio>``. It also reports how many engine outputs are identical
to the sequential transformers outputs (a throughput figure from wrong tokens would be worthless).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

# The workload is engine_vs_vllm.py's (beside this script, which Python puts first on sys.path).
from engine_vs_vllm import make_requests
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams
from frontier_runtime.tiny import make_tiny_checkpoint

STATIC_BATCH = 16


def run_engine(model_dir: Path, requests: list[tuple[list[int], int]]) -> tuple[float, list[list[int]]]:
    """A fresh engine each time, so no run profits from the previous one's prefix cache."""
    engine = LLMEngine(
        model_dir, max_batch_size=len(requests), max_num_batched_tokens=2048, cpu_kv_cache_bytes=256 << 20
    )
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=2, temperature=0.0))  # warm-up
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    engine.shutdown()
    return elapsed, outputs


def load_hf(model_dir: Path):  # noqa: ANN201 - transformers model
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # every request runs to its max_tokens, as in the engine
    model.generation_config.pad_token_id = 0
    return model


@torch.inference_mode()
def run_sequential(model, requests: list[tuple[list[int], int]]) -> tuple[float, list[list[int]]]:  # noqa: ANN001
    model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=2, do_sample=False)
    outputs = []
    start = time.perf_counter()
    for prompt, n in requests:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return time.perf_counter() - start, outputs


@torch.inference_mode()
def run_static(model, requests: list[tuple[list[int], int]]) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for i in range(0, len(requests), STATIC_BATCH):
        batch = requests[i : i + STATIC_BATCH]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):  # left padding
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        longest = max(n for _, n in batch)
        model.generate(
            ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest, do_sample=False
        )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="checkpoint directory (default: a fresh tiny model)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch intra-op threads, the same for all three (default: every core)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="frontier-bench-") as tmp:
        model_dir = args.model or make_tiny_checkpoint(Path(tmp) / "tiny", seed=args.seed)
        vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
        requests = make_requests(args.requests, vocab, args.seed)
        total_out = sum(n for _, n in requests)
        total_in = sum(len(p) for p, _ in requests)
        print(
            f"{len(requests)} requests, {total_in} prompt tokens, {total_out} output tokens "
            f"(prompts 8-256, outputs 16-256), torch threads {torch.get_num_threads()}"
        )

        def report(name: str, secs: float) -> float:
            rate = total_out / secs
            print(f"{name:<11} {secs:8.2f} s  {rate:9.1f} output tok/s", flush=True)
            return rate

        # The engine runs before and after transformers and counts with the mean of both, so a
        # load change on a shared machine during the run favours neither side.
        first_s, engine_out = run_engine(Path(model_dir), requests)
        print(f"engine (1st) {first_s:7.2f} s", flush=True)
        hf = load_hf(Path(model_dir))
        seq_s, seq_out = run_sequential(hf, requests)
        seq_rate = report("sequential", seq_s)
        static_rate = report("static", run_static(hf, requests))
        second_s, _ = run_engine(Path(model_dir), requests)
        print(f"engine (2nd) {second_s:7.2f} s", flush=True)
        engine_rate = report("engine", (first_s + second_s) / 2)

    same = sum(a == b for a, b in zip(engine_out, seq_out, strict=True))
    print(f"engine outputs identical to sequential transformers: {same}/{len(requests)}")
    print(f"vs_sequential={engine_rate / seq_rate:.2f} vs_static={engine_rate / static_rate:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
