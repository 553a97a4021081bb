"""How close each engine's bfloat16 greedy decoding stays to float32, Frontier's and vLLM's alike.

    python bench/bf16_accuracy.py [--model llama-100m] [--requests 16] [--max-tokens 64]
                                  [--threads 2] [--vllm-venv DIR] [--kernel-variant avx512]

Each engine (in a child process, as ``bench/engine_vs_vllm.py`` runs them, same checkpoints and
vLLM venv) decodes the same prompts greedily in bfloat16, returning each generated token with its
logprob. The reference is float32 transformers on the engine's own sequences: at every generated
position, whether the engine's token is float32's argmax after the same prefix, and how far the
engine's logprob of it is from float32's. Also the share of requests whose whole output equals
float32 greedy decoding (transformers, token for token). Last line:
``<engine>: argmax_equal=<k>/<n> mean_logprob_err=<e> outputs_equal=<k>/<m> ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import engine_vs_vllm as bench  # noqa: E402  (the workload, the checkpoints, the vLLM venv)

RESULT = "ACCURACY-RESULT "


def child_frontier(spec: dict) -> list[dict]:
    from frontier_runtime.requests import SamplingParams

    engine = bench.frontier_engine(spec["model"], "bfloat16", spec["threads"])
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True, logprobs=0)
    ids = [f"acc-{i}" for i in range(len(spec["prompts"]))]
    for rid, prompt in zip(ids, spec["prompts"], strict=True):
        engine.add_request(rid, prompt, params)
    got: dict[str, dict] = {rid: {"tokens": [], "logprobs": []} for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id]["tokens"].extend(out.new_token_ids)
            got[out.request_id]["logprobs"].extend(lp.logprob for lp in out.logprobs or [])
    engine.shutdown()
    return [got[rid] for rid in ids]


def child_vllm(spec: dict) -> list[dict]:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{spec['threads'] - 1}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm
    from vllm.inputs import TokensPrompt

    llm = vllm.LLM(
        model=spec["model"],
        dtype="bfloat16",
        max_num_seqs=bench.MAX_BATCH,
        max_model_len=spec["max_model_len"],
        kv_cache_memory_bytes=bench.KV_BYTES,
        seed=0,
    )
    params = vllm.SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True, logprobs=0)
    results = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params, use_tqdm=False
    )
    out = []
    for r in results:
        c = r.outputs[0]
        out.append(
            {
                "tokens": list(c.token_ids),
                "logprobs": [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs, strict=True)],
            }
        )
    return out


def reference(model: Path, prompts: list[list[int]], runs: dict[str, list[dict]], max_tokens: int) -> dict:
    """Float32 transformers: greedy outputs, and its logprobs at each engine's positions."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    summary: dict[str, dict] = {}
    with torch.no_grad():
        greedy = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = hf.generate(ids, max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
            greedy.append(out[0, len(prompt) :].tolist())
        for engine, outputs in runs.items():
            equal = argmax_equal = positions = 0
            err = 0.0
            for prompt, got, want in zip(prompts, outputs, greedy, strict=True):
                equal += got["tokens"] == want
                seq = torch.tensor([prompt + got["tokens"]])
                logp = torch.log_softmax(hf(seq).logits[0].double(), -1)
                for i, (tok, lp) in enumerate(zip(got["tokens"], got["logprobs"], strict=True)):
                    row = logp[len(prompt) - 1 + i]
                    argmax_equal += int(row.argmax()) == tok
                    err += abs(float(row[tok]) - lp)
                    positions += 1
            summary[engine] = {
                "argmax_equal": f"{argmax_equal}/{positions}",
                "mean_logprob_err": round(err / positions, 5),
                "outputs_equal": f"{equal}/{len(prompts)}",
            }
    return summary


def run(kind: str, python: Path, spec: dict, spec_path: Path) -> list[dict]:
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(ROOT.parent / "runtime"), OMP_NUM_THREADS=str(spec["threads"]))
    if kind == "vllm":
        env.pop("PYTHONPATH")
    proc = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--child", kind, "--spec", str(spec_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"{kind} child failed with exit status {proc.returncode}")
    return json.loads(lines[-1][len(RESULT) :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-100m", choices=list(bench.SHAPES))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vllm-venv", type=Path, help="an existing venv with vLLM (default: .frontier's)")
    parser.add_argument("--kernel-variant", help="the best native kernel variant Frontier may load")
    parser.add_argument("--only", choices=["frontier", "vllm"])
    parser.add_argument("--child", choices=["frontier", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.spec.read_text())
        result = (child_frontier if args.child == "frontier" else child_vllm)(spec)
        print(RESULT + json.dumps(result), flush=True)
        return
    if args.kernel_variant:
        os.environ["FRONTIER_KERNEL_VARIANT"] = args.kernel_variant
    model = bench.ensure_model(args.model)
    config = json.loads((model / "config.json").read_text())
    prompts = [p for p, _ in bench.make_requests(args.requests, config["vocab_size"], args.seed)]
    spec = {
        "model": str(model),
        "threads": args.threads,
        "prompts": prompts,
        "max_tokens": args.max_tokens,
        "max_model_len": config["max_position_embeddings"],
    }
    pythons = {"frontier": Path(sys.executable)}
    if args.only != "frontier":
        pythons["vllm"] = bench.ensure_vllm_venv(args.vllm_venv)
    kinds = [args.only] if args.only else ["frontier", "vllm"]
    spec_path = bench.MODELS_DIR / f"accuracy-spec-{os.getpid()}.json"
    try:
        runs = {kind: run(kind, pythons[kind], spec, spec_path) for kind in kinds}
    finally:
        spec_path.unlink(missing_ok=True)
    summary = reference(model, prompts, runs, args.max_tokens)
    print(" ".join(f"{k}: " + " ".join(f"{n}={v}" for n, v in s.items()) for k, s in summary.items()))


if __name__ == "__main__":
    main()
