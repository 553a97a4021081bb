"""Decode throughput of a random Mixtral-style MoE checkpoint: Frontier at EP=1 and EP=2 against
transformers' ``generate`` and vLLM's CPU engine, side by side in one run.

    python bench/moe_parallel.py [--rounds 2] [--requests 16] [--new 128] [--threads 2]
                                 [--engines frontier-ep1,frontier-ep2,transformers,vllm]

The checkpoint (8 experts, top-2, hidden 256, 4 layers, 8 query / 4 KV heads, expert size 512,
vocab 4096: 14M parameters, 3.7M active per token) is written once under
``.frontier/bench-models/moe-8x2`` with a classic Mixtral config.json, which both transformers 5.x
and vLLM's pinned older transformers read. Every engine runs in a fresh subprocess on the same
requests (equal 16-token prompts, so transformers batches them without padding; greedy, EOS
ignored, ``--new`` tokens each) with the same CPU budget: EP=2 runs two processes of
``threads / 2`` intra-op threads each (``threads_per_rank``). Engines alternate round by round so a
load change on a shared machine favours none.

Decode tok/s = output tokens / seconds of the timed ``generate`` (prefill included: 16-token
prompts against ``--new`` output tokens). Each row also says how many outputs equal Frontier
EP=1's, token for token, and, for EP=2, the bytes the combine all-reduced per decode step.

vLLM lives in its own venv (``.frontier/vllm-venv``, see ``bench/engine_vs_vllm.py``); if it
cannot run this checkpoint its row says why and the others still print. Nothing in CI runs this.
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
MODELS_DIR = ROOT / ".frontier" / "bench-models"
VLLM_PYTHON = ROOT / ".frontier" / "vllm-venv" / "bin" / "python"
RESULT = "BENCH-RESULT "
PROMPT_LEN = 16
CONFIG = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "sliding_window": None,
    "router_aux_loss_coef": 0.0,
    "output_router_logits": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
ENGINES = ("frontier-ep1", "frontier-ep2", "transformers", "vllm")


def ensure_model() -> Path:
    """The random checkpoint: matrices std 0.1, norms around 1 (near-uniform logits would make the
    equality columns meaningless: argmax would flip on rounding noise)."""
    import torch
    from safetensors.torch import save_file

    out = MODELS_DIR / "moe-8x2"
    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    c, g = CONFIG, torch.Generator().manual_seed(0)
    h, inter, kv = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"]
    head_dim = h // c["num_attention_heads"]

    def mat(*shape: int) -> torch.Tensor:
        return 0.1 * torch.randn(*shape, generator=g)

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(h, generator=g)

    tensors = {"model.embed_tokens.weight": mat(c["vocab_size"], h), "model.norm.weight": norm()}
    tensors["lm_head.weight"] = mat(c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm()
        tensors[p + "post_attention_layernorm.weight"] = norm()
        tensors[p + "self_attn.q_proj.weight"] = mat(h, h)
        tensors[p + "self_attn.k_proj.weight"] = mat(kv * head_dim, h)
        tensors[p + "self_attn.v_proj.weight"] = mat(kv * head_dim, h)
        tensors[p + "self_attn.o_proj.weight"] = mat(h, h)
        tensors[p + "block_sparse_moe.gate.weight"] = mat(c["num_local_experts"], h)
        for e in range(c["num_local_experts"]):
            x = f"{p}block_sparse_moe.experts.{e}."
            tensors[x + "w1.weight"] = mat(inter, h)
            tensors[x + "w3.weight"] = mat(inter, h)
            tensors[x + "w2.weight"] = mat(h, inter)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2))
    return out


def make_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, CONFIG["vocab_size"]) for _ in range(PROMPT_LEN)] for _ in range(n)]


# -- the children ---------------------------------------------------------------------------------


def child_frontier(spec: dict, expert_parallel: int) -> dict:
    import torch
    from frontier_runtime.engine.llm_engine import LLMEngine
    from frontier_runtime.models.llama.moe import SparseMoE
    from frontier_runtime.requests import SamplingParams

    engine = LLMEngine(
        spec["model"],
        dtype="float32",
        expert_parallel_size=expert_parallel,
        cpu_threads=spec["threads"],
        max_batch_size=len(spec["prompts"]),
        max_num_batched_tokens=512,
        prefix_caching=False,
    )
    torch.set_num_threads(engine.config.threads_per_rank)
    params = SamplingParams(max_tokens=spec["new"], temperature=0.0, ignore_eos=True)
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    layers = [layer.mlp for layer in engine.runner.model.layers if isinstance(layer.mlp, SparseMoE)]
    before = sum(m.combined_bytes for m in layers)
    steps_before = engine.stats().steps
    start = time.perf_counter()
    outputs = engine.generate(spec["prompts"], params)
    seconds = time.perf_counter() - start
    steps = engine.stats().steps - steps_before
    combined = sum(m.combined_bytes for m in layers) - before
    engine.shutdown()
    return {"seconds": seconds, "outputs": outputs, "combined_bytes": combined, "steps": steps}


def child_transformers(spec: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
    ids = torch.tensor(spec["prompts"])
    kwargs = {"do_sample": False, "max_new_tokens": spec["new"], "min_new_tokens": spec["new"]}
    with torch.inference_mode():
        model.generate(ids[:1, :4], max_new_tokens=4, do_sample=False)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "outputs": out[:, PROMPT_LEN:].tolist()}


def child_vllm(spec: dict) -> dict:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{spec['threads'] - 1}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import vllm
    from vllm.inputs import TokensPrompt

    llm = vllm.LLM(
        model=spec["model"],
        dtype="float32",
        max_num_seqs=len(spec["prompts"]),
        max_num_batched_tokens=512,
        max_model_len=CONFIG["max_position_embeddings"],
        kv_cache_memory_bytes=256 << 20,
        seed=0,
        skip_tokenizer_init=True,  # token ids in, token ids out: the checkpoint has no tokenizer
    )
    sp = vllm.SamplingParams
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3, 4])], sp(max_tokens=4, temperature=0.0))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    params = sp(max_tokens=spec["new"], temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "outputs": [list(r.outputs[0].token_ids) for r in results]}


def run_child(engine: str, spec: dict, spec_path: Path) -> dict | str:
    """The child's result, or why it failed (the last line of its error output)."""
    spec_path.write_text(json.dumps(spec))
    python = VLLM_PYTHON if engine == "vllm" else Path(sys.executable)
    if engine == "vllm" and not python.is_file():
        return f"no vLLM venv at {python.parent.parent} (bench/engine_vs_vllm.py creates it)"
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]))
    if engine == "vllm":
        env.pop("PYTHONPATH", None)  # its own transformers; it needs nothing of ours
    else:
        env["PYTHONPATH"] = str(ROOT / "runtime")
    cmd = [str(python), str(Path(__file__).resolve()), "--child", engine, "--spec", str(spec_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        return f"failed (exit {proc.returncode}): {errors[-1] if errors else 'no output'}"
    return json.loads(lines[-1][len(RESULT) :])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new", type=int, default=128, help="output tokens per request")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--engines", default=",".join(ENGINES), help="a comma-separated subset")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        spec = json.loads(args.spec.read_text())
        if args.child.startswith("frontier"):
            result = child_frontier(spec, expert_parallel=int(args.child[-1]))
        else:
            result = (child_transformers if args.child == "transformers" else child_vllm)(spec)
        print(RESULT + json.dumps(result), flush=True)
        return

    engines = [e for e in ENGINES if e in args.engines.split(",")]
    spec = {
        "model": str(ensure_model()),
        "prompts": make_prompts(args.requests, seed=0),
        "new": args.new,
        "threads": args.threads,
    }
    total = args.requests * args.new
    print(
        f"== moe-8x2 (8 experts, top-2, 14M parameters), {args.requests} requests x {PROMPT_LEN} prompt + "
        f"{args.new} output tokens, float32, {args.threads} threads",
        flush=True,
    )
    rates: dict[str, list[float]] = {e: [] for e in engines}
    results: dict[str, dict] = {}
    failed: dict[str, str] = {}
    spec_path = MODELS_DIR / f"moe-spec-{os.getpid()}.json"
    try:
        for r in range(args.rounds):
            for engine in engines if r % 2 == 0 else engines[::-1]:
                if engine in failed:
                    continue
                res = run_child(engine, spec, spec_path)
                if isinstance(res, str):
                    failed[engine] = res
                    print(f"   round {r + 1} {engine:<13} {res}", flush=True)
                    continue
                rates[engine].append(total / res["seconds"])
                results[engine] = res
                print(
                    f"   round {r + 1} {engine:<13} {res['seconds']:7.2f} s {rates[engine][-1]:8.1f} tok/s",
                    flush=True,
                )
    finally:
        spec_path.unlink(missing_ok=True)

    base = results.get("frontier-ep1")
    print(f"\n| engine | decode tok/s (median of {args.rounds}) | vs Frontier EP=1 | outputs equal to EP=1 |")
    print("|---|---:|---:|---:|")
    for engine in engines:
        if engine in failed:
            print(f"| {engine} | {failed[engine]} | | |")
            continue
        med = statistics.median(rates[engine])
        ratio = med / statistics.median(rates["frontier-ep1"]) if base else float("nan")
        same = (
            sum(a == b for a, b in zip(results[engine]["outputs"], base["outputs"], strict=True))
            if base
            else 0
        )
        print(f"| {engine} | {med:.1f} | {ratio:.2f} | {same}/{args.requests} |")
    ep2 = results.get("frontier-ep2")
    if ep2 and ep2["steps"]:
        per_step = ep2["combined_bytes"] / ep2["steps"]
        print(
            f"\nEP=2 combine: {ep2['combined_bytes']} bytes of partial sums all-reduced over {ep2['steps']} steps "
            f"({per_step:.0f} per step, {CONFIG['num_hidden_layers']} sparse layers; a 2-rank ring sends "
            "each rank's whole partial sum once: 2 (G - 1) / G = 1)"
        )


if __name__ == "__main__":
    main()
