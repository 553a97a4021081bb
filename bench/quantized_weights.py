"""CPU decode speed, weight memory and greedy agreement of int8 weights against float32 and bfloat16.

    python bench/quantized_weights.py [--rounds 2] [--threads 1] [--batch 1 --batch 8]

One random Llama-shaped checkpoint (hidden 1024, 8 layers, 90M projection weights: 360 MB in
float32, far beyond the caches, so a decode step streams its weights from memory as a large model's
does) is served by ``LLMEngine`` in each variant, each in a fresh subprocess, the variants
interleaved round by round so a busy machine's noise falls on all of them:

    fp32              float32 weights, the panel GEMM
    bf16              bfloat16 weights (oneDNN's native bf16 GEMM on CPUs with AVX512-BF16)
    int8              int8 weights in the panel GEMM (widened in the kernel), float32 activations
    int8+bf16         int8 weights, bfloat16 activations
    fp32/torch-ops    float32, native kernels off (FRONTIER_NATIVE_KERNELS=0): torch ops only
    int8/torch-ops    int8 through torch._weight_int8pack_mm, native kernels off

Decode tok/s: ``batch`` sequences of 16 prompt tokens each generate 64 tokens (greedy, EOS
ignored); the prefill's time is measured apart and left out. Weights: the bytes of the model's
parameters, buffers and packed layouts. Agreement: 128 prompts, 16 greedy tokens each, against
the fp32 variant's (whole outputs identical, and tokens position by position). Prints one table
with each variant's median tok/s over the rounds and its ratio to fp32.

    PYTHONPATH=runtime python3 bench/quantized_weights.py --gpu-check

checks the CUDA paths on a GPU host (no pydantic needed: the loader and the layers only): a random
checkpoint quantized at load to int8 and fp8 on ``cuda``, each projection's output against the
dequantized weights' (fp8 on sm90 through ``torch._scaled_mm``, which quantizes activations too),
and prints one JSON line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))

VARIANTS = {
    "fp32": ({"dtype": "float32"}, True),
    "bf16": ({"dtype": "bfloat16"}, True),
    "int8": ({"dtype": "float32", "quantization": "int8"}, True),
    "int8+bf16": ({"dtype": "bfloat16", "quantization": "int8"}, True),
    "fp32/torch-ops": ({"dtype": "float32"}, False),
    "int8/torch-ops": ({"dtype": "float32", "quantization": "int8"}, False),
}
# On a GPU host (--gpu-engine): the same engine on CUDA, bf16 activations, a model whose decode streams
# 3.5 GB of weights per step (hidden 4096, 8 layers, MLP 14336: 1.75B projection weights).
GPU_VARIANTS = {
    "bf16": {"dtype": "bfloat16", "device": "cuda"},
    "int8": {"dtype": "bfloat16", "device": "cuda", "quantization": "int8"},
    "fp8": {"dtype": "bfloat16", "device": "cuda", "quantization": "fp8"},
}
GPU_SHAPE = {
    "hidden_size": 4096,
    "num_layers": 8,
    "num_heads": 32,
    "num_kv_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
    "initializer_range": 0.0125,
}
SHAPE = {
    "hidden_size": 1024,
    "num_layers": 8,
    "num_heads": 16,
    "num_kv_heads": 4,
    "intermediate_size": 2816,
    "vocab_size": 4096,
    "tie_word_embeddings": True,
    # Each layer's gain std * sqrt(hidden) ~ 0.8 as in the tests' model (std 0.05 at hidden 256): at
    # larger gains a random model is chaotic and even bf16's greedy tokens part from fp32's at once.
    "initializer_range": 0.025,
}

CHILD = r"""
import json, random, sys, time
import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.models.llama import quant
from frontier_runtime.requests import SamplingParams
model, settings, batches, threads, agree_n = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
# No prefix cache: the timed run repeats the prompts of the prefill it subtracts.
engine = LLMEngine(model, max_batch_size=32, max_num_batched_tokens=1024, cpu_threads=threads, prefix_caching=False, **settings)
rng = random.Random(0)
greedy = lambda n: SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
engine.generate([[5, 6, 7]], greedy(4))  # warm up
tok_s = {}
for batch in batches:
    prompts = [[rng.randrange(8, 4000) for _ in range(16)] for _ in range(batch)]
    start = time.perf_counter()
    engine.generate(prompts, greedy(1))  # prefill and one token: timed apart
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    outs = engine.generate(prompts, greedy(65))
    total = time.perf_counter() - start
    tok_s[str(batch)] = 64 * batch / max(total - prefill, 1e-9)
arng = random.Random(11)
prompts = [[arng.randrange(8, 4000) for _ in range(arng.randint(3, 60))] for _ in range(agree_n)]
outputs = engine.generate(prompts, greedy(16))
print(json.dumps({"tok_s": tok_s, "weight_bytes": quant.weight_bytes(engine.runner.model), "outputs": outputs}))
engine.shutdown()
"""


def run(model: Path, name: str, batches: list[int], threads: int, agree_n: int, *, gpu: bool = False) -> dict:
    settings, native = (GPU_VARIANTS[name], True) if gpu else VARIANTS[name]
    path = os.pathsep.join(p for p in (str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "FRONTIER_NATIVE_KERNELS": "1" if native else "0"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), json.dumps(settings), json.dumps(batches), str(threads), str(agree_n)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"variant {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_check() -> None:
    """The CUDA paths of int8 and fp8 weights, layer by layer, on a random checkpoint."""
    import torch
    from frontier_runtime.models.llama import quant
    from frontier_runtime.models.llama.layers import Linear
    from frontier_runtime.models.llama.loader import load_model
    from frontier_runtime.tiny import make_tiny_checkpoint

    device = torch.device("cuda")
    print(
        json.dumps({"device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability()})
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_checkpoint(Path(tmp) / "model", seed=0, device="cuda", **SHAPE)
        for scheme in ("int8", "fp8"):
            model = load_model(model_dir, torch.bfloat16, device, quantization=scheme)
            x = torch.randn(37, SHAPE["hidden_size"], dtype=torch.bfloat16, device=device)
            worst, paths = 0.0, set()
            for layer in model.modules():
                if not isinstance(layer, Linear) or layer.qweight is None or layer.in_features != x.shape[1]:
                    continue
                got = layer(x).float()
                want = x.float() @ quant.dequantize(layer.qweight, layer.weight_scale, torch.float32).t()
                worst = max(worst, ((got - want).norm() / want.norm()).item())
                fp8_mm = layer.qweight.dtype == quant.FP8 and quant.scaled_mm_applies(x, layer.qweight)
                paths.add("scaled_mm" if fp8_mm else "dequantize")
            path = "+".join(sorted(paths))
            print(json.dumps({
                "scheme": scheme, "path": path, "weight_bytes": quant.weight_bytes(model),
                "worst_relative_error": worst, "ok": worst < (0.08 if "scaled_mm" in paths else 0.01),
            }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, action="append", help="decode batch sizes (default 1 and 8)")
    parser.add_argument("--prompts", type=int, default=128, help="prompts of the agreement check")
    parser.add_argument("--variant", action="append", choices=list(VARIANTS), help="default: all")
    parser.add_argument("--gpu-check", action="store_true", help="check the CUDA paths instead (a GPU host)")
    parser.add_argument(
        "--gpu-engine",
        action="store_true",
        help="bf16, int8 and fp8 weights through the engine on CUDA (a GPU host)",
    )
    parser.add_argument(
        "--write-table",
        action="store_true",
        help="write the measured factors into the planner's table (frontier/capacity/quantization_speed.json)",
    )
    args = parser.parse_args()
    if args.gpu_check:
        gpu_check()
        return
    gpu = args.gpu_engine
    batches = args.batch or ([1, 16, 32] if gpu else [1, 8])
    names = list(GPU_VARIANTS) if gpu else (args.variant or list(VARIANTS))
    reference_name = "bf16" if gpu else "fp32"
    if reference_name not in names:
        names.insert(0, reference_name)  # the reference of every ratio
    from frontier_runtime.models.llama.quant import agreement
    from frontier_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_checkpoint(
            Path(tmp) / "model", seed=0, device="cuda" if gpu else "cpu", **(GPU_SHAPE if gpu else SHAPE)
        )
        speeds: dict[str, dict[str, list[float]]] = {n: {str(b): [] for b in batches} for n in names}
        last: dict[str, dict] = {}
        for r in range(args.rounds):
            for name in names:
                result = run(model, name, batches, args.threads, args.prompts, gpu=gpu)
                for b, value in result["tok_s"].items():
                    speeds[name][b].append(value)
                last[name] = result
                print(
                    f"round {r + 1} {name:15s} "
                    + " ".join(f"b{b}={v:7.1f}" for b, v in result["tok_s"].items())
                )
    reference = last[reference_name]
    where = "CUDA decode, bf16 activations" if gpu else f"CPU decode, {args.threads} thread(s)"
    print(
        f"\n{where}, median of {args.rounds} round(s); agreement over {args.prompts} prompts x 16 tokens vs "
        f"{reference_name}"
    )
    head = f"| variant | weights MB | vs {reference_name} | vs bf16 |"
    head += (
        "".join(f" b{b} tok/s | vs {reference_name} |" for b in batches)
        + " identical prompts | same tokens |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    bf16_bytes = last["bf16"]["weight_bytes"] if "bf16" in last else None
    for name in names:
        res = last[name]
        mb = res["weight_bytes"] / 1e6
        row = f"| {name} | {mb:.1f} | {res['weight_bytes'] / reference['weight_bytes']:.2f} |"
        row += f" {res['weight_bytes'] / bf16_bytes:.2f} |" if bf16_bytes else " - |"
        for b in batches:
            mine, ref = (
                statistics.median(speeds[name][str(b)]),
                statistics.median(speeds[reference_name][str(b)]),
            )
            row += f" {mine:.1f} | {mine / ref:.2f} |"
        agree = agreement(reference["outputs"], res["outputs"])
        row += f" {agree.prompt_fraction:.1%} | {agree.token_fraction:.1%} |"
        print(row)
    if args.write_table:
        write_table(speeds, batches, gpu, args)


# Each quantized variant against the unquantized one of its activation dtype, as the planner asks.
PAIRS = {"int8": ("fp32", "float32", "int8"), "int8+bf16": ("bf16", "bfloat16", "int8")}
GPU_PAIRS = {"int8": ("bf16", "bfloat16", "int8"), "fp8": ("bf16", "bfloat16", "fp8")}


def write_table(speeds: dict[str, dict[str, list[float]]], batches: list[int], gpu: bool, args) -> None:
    """Replace this device kind's rows of the planner's table with this run's medians."""
    import datetime
    import platform

    table = ROOT / "frontier" / "capacity" / "quantization_speed.json"
    device = "cuda" if gpu else "cpu"
    machine = _gpu_name() if gpu else _cpu_name()
    flags = " --gpu-engine" if gpu else f" --threads {args.threads}"
    source = (
        f"bench/quantized_weights.py{flags} --rounds {args.rounds}, {machine} ({platform.machine()}), "
        f"{datetime.date.today().isoformat()}"
    )
    rows = [r for r in json.loads(table.read_text())["measurements"] if r["device"] != device]
    for name, (reference, dtype, method) in (GPU_PAIRS if gpu else PAIRS).items():
        if name not in speeds or reference not in speeds:
            continue
        for b in batches:
            factor = statistics.median(speeds[name][str(b)]) / statistics.median(speeds[reference][str(b)])
            rows.append(
                {"device": device, "dtype": dtype, "method": method, "batch": b, "factor": round(factor, 3), "source": source}
            )
    rows.sort(key=lambda r: (r["device"], r["dtype"], r["method"], r["batch"]))
    table.write_text(json.dumps({"measurements": rows}, indent=2) + "\n")
    print(f"wrote {len(rows)} rows to {table.relative_to(ROOT)}")


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            flags = Path("/proc/cpuinfo").read_text()
            return line.split(":", 1)[1].strip() + (", avx512_bf16" if "avx512_bf16" in flags else "")
    return "unknown CPU"


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


if __name__ == "__main__":
    main()
