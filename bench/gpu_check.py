"""Frontier's engine on one NVIDIA GPU: greedy equality against transformers, throughput, KV memory.

    PYTHONPATH=runtime:hostside python bench/gpu_check.py [--out DIR] [--layers 20]   (bench/gpu_check.sh runs it)

Made to run in one go, in a few minutes, on a GPU machine that has only torch (CUDA),
transformers, safetensors and tokenizers (and the few wheels bench/gpu_check.sh carries): it
imports the engine directly (``LLMEngine``; no server, no boto3) and nothing else of the project.

1. Writes a random ~1B-parameter Llama (hidden 2048, 20 layers, 32 query / 8 KV heads, SwiGLU
   5632, vocab 32000, bfloat16) with ``frontier_runtime.tiny``.
2. Greedy equality: 8 prompts, 32 new tokens each, transformers ``generate`` one prompt at a time
   on CUDA vs the engine with all 8 batched; both bfloat16, so a differing kernel may flip a
   near-tie: the table gives how many outputs are identical and the mean length of the common
   prefix.
3. Output tokens/s at 1, 16 and 64 concurrent streams (prompt 128 tokens, 256 new tokens each,
   greedy, EOS ignored), the KV cache the engine got (blocks, GiB), its attention backend and
   whether decode steps replay CUDA graphs.
4. The same with an fp8 (e4m3) KV cache: twice the blocks, and its greedy agreement with the
   bfloat16 cache (tokens equal, position by position, over the 8 prompts).

Prints one table; the last line is ``gpu_check ok=<bool> ...``. ``--smoke`` runs the same script
on CPU with a 5M-parameter model (a check of the script itself where no GPU is).
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from pathlib import Path

import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.ops.paged_attention import _flash_varlen_works
from frontier_runtime.requests import SamplingParams
from frontier_runtime.tiny import make_tiny_checkpoint

SHAPE = {
    "hidden_size": 2048,
    "num_heads": 32,
    "num_kv_heads": 8,
    "intermediate_size": 5632,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "dtype": "bfloat16",
}
SMOKE_SHAPE = {
    **SHAPE,
    "hidden_size": 256,
    "num_heads": 8,
    "num_kv_heads": 4,
    "intermediate_size": 688,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "initializer_range": 0.1,
}
DEVICE = "cuda"
PROMPT_VOCAB = 4096  # ids the tokenizer knows (it has 4096 tokens; the model's vocab is larger)
STREAMS = (1, 16, 64)


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, PROMPT_VOCAB) for _ in range(length)] for _ in range(n)]


@torch.inference_mode()
def hf_greedy(model_dir: Path, inputs: list[list[int]], new: int) -> list[list[int]]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(DEVICE).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    outs = []
    for p in inputs:
        ids = torch.tensor([p], device=DEVICE)
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False
        )
        outs.append(out[0, len(p) :].tolist())
    del model
    release()
    return outs


def release() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def throughput(engine: LLMEngine, streams: int, prompt_len: int, new: int) -> float:
    work = prompts(streams, prompt_len, seed=streams)
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    sync()
    start = time.perf_counter()
    outs = engine.generate(work, params)
    sync()
    return sum(len(o) for o in outs) / (time.perf_counter() - start)


def run_engine(model_dir: Path, kv: str, block: int, eq_prompts: list[list[int]], new: int) -> dict:
    start = time.perf_counter()
    engine = LLMEngine(
        model_dir,
        dtype="auto",
        device=DEVICE,
        kv_cache_dtype=kv,
        block_size=block,
        max_batch_size=64,
        max_num_batched_tokens=8192,
        gpu_memory_utilization=0.85,
    )
    runner = engine.runner
    row = {
        "kv": kv,
        "load_s": time.perf_counter() - start,
        "backend": runner.backend,
        "graphs": len(runner.graphs),
        "blocks": runner.num_blocks,
        "kv_gib": runner.num_blocks * runner.bytes_per_block / 2**30,
    }
    greedy = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))  # warm-up
    row["greedy"] = engine.generate(eq_prompts, greedy)
    for n in STREAMS:
        row[f"tok_s_{n}"] = throughput(engine, n, 128, 256)
    engine.shutdown()
    del engine, runner
    release()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where to write the checkpoint (default: a temporary dir)")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--new", type=int, default=32, help="new tokens per prompt in the equality check")
    parser.add_argument("--smoke", action="store_true", help="run on CPU with a 5M model (checks the script)")
    args = parser.parse_args()
    global DEVICE
    shape = SHAPE
    if args.smoke:
        DEVICE, shape, args.layers = "cpu", SMOKE_SHAPE, 2
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="frontier-gpu-check-") as tmp:
        model_dir = args.out or Path(tmp) / "llama-1b"
        if not (model_dir / "config.json").is_file():
            make_tiny_checkpoint(model_dir, seed=0, num_layers=args.layers, **shape)
        params = sum(
            t.numel()
            for t in __import__("safetensors.torch", fromlist=["load_file"])
            .load_file(str(model_dir / "model.safetensors"))
            .values()
        )
        print(
            f"checkpoint {model_dir}: {params / 1e9:.2f} B parameters, written in {time.perf_counter() - t0:.0f} s"
        )
        eq_prompts = [p[: 16 + 13 * i] for i, p in enumerate(prompts(8, 128, seed=1))]
        ref = hf_greedy(model_dir, eq_prompts, args.new)
        # FlashAttention's paged kernel may require pages of 256 tokens; use the smallest that works.
        dev = torch.device(DEVICE)
        fits = [b for b in (16, 256) if dev.type == "cuda" and _flash_varlen_works(dev, b, torch.bfloat16)]
        block = fits[0] if fits else 16
        rows = [run_engine(model_dir, kv, block, eq_prompts, args.new) for kv in ("auto", "fp8")]

    bf16, fp8 = rows
    same = sum(a == b for a, b in zip(bf16["greedy"], ref, strict=True))
    prefix = sum(common_prefix(a, b) for a, b in zip(bf16["greedy"], ref, strict=True)) / len(ref)
    pos_total = sum(len(o) for o in bf16["greedy"])
    fp8_equal = sum(
        x == y for a, b in zip(fp8["greedy"], bf16["greedy"], strict=True) for x, y in zip(a, b, strict=True)
    )
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (smoke run)"
    print(f"\n{name}, torch {torch.__version__}, block size {block}")
    print(
        f"greedy vs transformers (bf16, {len(ref)} prompts x {args.new} tokens): {same}/{len(ref)} identical, "
        f"mean common prefix {prefix:.1f} tokens"
    )
    header = f"{'kv cache':<9} {'backend':<13} {'graphs':>6} {'blocks':>8} {'KV GiB':>7} " + " ".join(
        f"{f'{n} streams':>11}" for n in STREAMS
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{('bf16' if r['kv'] == 'auto' else r['kv']):<9} {r['backend']:<13} {r['graphs']:>6} {r['blocks']:>8} "
            f"{r['kv_gib']:>7.2f} " + " ".join(f"{r[f'tok_s_{n}']:>7.0f} t/s" for n in STREAMS)
        )
    print(
        f"fp8 vs bf16 KV cache: {fp8_equal}/{pos_total} greedy tokens equal free-running (one flipped near-tie changes the rest) "
        f"({fp8_equal / pos_total:.1%}), blocks x{fp8['blocks'] / bf16['blocks']:.2f}"
    )
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(
        f"gpu_check ok={same == len(ref)} identical={same}/{len(ref)} "
        + " ".join(f"tok_s_{n}={bf16[f'tok_s_{n}']:.0f}" for n in STREAMS)
        + f" kv_gib={bf16['kv_gib']:.2f} fp8_agree={fp8_equal / pos_total:.3f}"
    )


if __name__ == "__main__":
    main()
