"""Frontier's engine on one NVIDIA GPU, in phases that each write their JSON before the next starts.

    bash bench/gpu_check.sh                     # on the GPU machine (carries the wheels it needs)
    PYTHONPATH=runtime:hostside python bench/gpu_check.py --out-dir DIR [--smoke]

Made for a short lease: under 7 minutes in all, each phase under its own time limit, results on disk
as they come (a lease that ends half-way still leaves the phases that ran). It imports the engine
directly (``LLMEngine``; no server, no boto3) and torch, transformers and safetensors beside it.

0. ``env``: torch, CUDA, the GPU, Triton, ``varlen_attn``'s signature, which block sizes each paged
   attention backend accepts (each probed on a tiny step against SDPA), and the device-to-device
   copy bandwidth (the HBM figure phase 4 divides by). Under 30 s.
1. ``start``: a random ~1B-parameter Llama drawn on the GPU (hidden 2048, 20 layers, 32 query / 8 KV
   heads, SwiGLU 5632, vocab 32000, bfloat16; weights of std 0.05 so the top two logits are rarely
   within rounding of each other), then an engine start: the KV sizing from measured memory, the
   decode-graph capture, the backend and kernels it chose.
2. ``logits``: 8 prompts of 16..107 tokens, 32 greedy tokens each with their logprobs; transformers
   runs prompt + output teacher-forced in float32 (the truth) and in bfloat16 (the yardstick): the
   engine's tokens and logprobs must be as close to the truth as transformers' own bfloat16 run
   (argmax agreement, flips beyond ``--margin``, logprob error; see ``compare_logits``).
3. ``graphs``: the same prompts decoded with the captured graphs and eagerly (graphs set aside):
   tokens and logprobs compared, and the decode step time of each.
4. ``throughput``: output tokens/s at 1, 16 and 64 streams (prompt 128, 256 new tokens, greedy, EOS
   ignored) for each backend that runs here (and an fp8 KV cache), with the time per decode step and
   the fraction of the measured HBM bandwidth it achieves (weights plus the KV read per step).
5. ``vllm``: vLLM on the same GPU with dummy weights of the same shape, in its own environment, when
   it is installed there; otherwise the phase says so.

``--smoke`` runs the same phases on CPU with a 5M-parameter model and small loads: the script's
rehearsal, which the test suite runs (tests/runtime/engine/test_gpu_check_smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.ops import attention
from frontier_runtime.requests import SamplingParams
from frontier_runtime.tiny import make_tiny_checkpoint

SHAPE = {
    "hidden_size": 2048,
    "num_layers": 20,
    "num_heads": 32,
    "num_kv_heads": 8,
    "intermediate_size": 5632,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "initializer_range": 0.05,
    "dtype": "bfloat16",
}
SMOKE_SHAPE = {
    **SHAPE,
    "hidden_size": 256,
    "num_layers": 2,
    "num_heads": 8,
    "num_kv_heads": 2,
    "intermediate_size": 688,
    "vocab_size": 4096,
    "max_position_embeddings": 512,
    "initializer_range": 0.1,
}
PROMPT_VOCAB = 4096  # ids the tokenizer knows (the model's vocabulary may be larger)
BLOCK_SIZES = (16, 32, 64, 128, 256)


class Check:
    """Where the phases write, and what the run has so far (one JSON file per phase)."""

    def __init__(self, out_dir: Path, smoke: bool) -> None:
        self.out_dir = out_dir
        self.smoke = smoke
        self.device = "cpu" if smoke else "cuda"
        self.results: dict[str, dict[str, Any]] = {}
        self.started = time.perf_counter()
        out_dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def phase(self, number: int, name: str, limit_s: int) -> Iterator[dict[str, Any]]:
        """Runs one phase under its time limit; its JSON is written whatever happens inside."""
        row: dict[str, Any] = {"phase": number, "name": name, "limit_s": limit_s}
        print(f"[{time.perf_counter() - self.started:6.1f} s] phase {number} {name} ...", flush=True)
        start = time.perf_counter()

        def expire(signum: int, frame: object) -> None:
            raise TimeoutError(f"phase {name} ran past its {limit_s} s")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(limit_s)
        try:
            yield row
            row.setdefault("ok", True)
        except Exception as exc:  # a phase's failure is a result: recorded, and the next phase runs
            row["ok"] = False
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc(limit=8)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
            row["seconds"] = round(time.perf_counter() - start, 2)
            self.results[name] = row
            path = self.out_dir / f"phase{number}_{name}.json"
            path.write_text(json.dumps(row, indent=2, default=str) + "\n")
            print(
                f"[{time.perf_counter() - self.started:6.1f} s] phase {number} {name}: "
                f"ok={row['ok']} ({row['seconds']} s) -> {path}",
                flush=True,
            )


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(8, PROMPT_VOCAB) for _ in range(length)] for _ in range(n)]


def equality_prompts() -> list[list[int]]:
    """8 prompts of 16..107 tokens: prefills of several block counts, then decodes."""
    return [p[: 16 + 13 * i] for i, p in enumerate(prompts(8, 128, seed=1))]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# -- phase 0 ---------------------------------------------------------------------------------------


def environment(row: dict[str, Any], device: str) -> None:
    row["copy_gb_s"] = round(copy_bandwidth(device) / 1e9, 1)  # first: phase 4 needs it
    row["python"] = platform.python_version()
    row["torch"] = torch.__version__
    row["cuda"] = torch.version.cuda
    row["cuda_available"] = torch.cuda.is_available()
    try:
        import triton

        row["triton"] = triton.__version__
    except ImportError:
        row["triton"] = None
    try:
        from torch.nn.attention.varlen import varlen_attn

        row["varlen_attn_signature"] = str(inspect.signature(varlen_attn))
    except ImportError as exc:
        row["varlen_attn_signature"] = f"unavailable: {exc}"
    dev = torch.device(device)
    if device == "cuda":
        props = torch.cuda.get_device_properties(dev)
        row["gpu"] = props.name
        row["capability"] = f"{props.major}.{props.minor}"
        row["memory_gib"] = round(props.total_memory / 2**30, 1)
        row["multiprocessors"] = props.multi_processor_count
    accepted: dict[str, dict[str, str]] = {}
    # Triton compiles a kernel per page size (a second or two each on a GPU): two of them.
    sizes = {"flash-varlen": BLOCK_SIZES, "triton": (16, 256), "sdpa-gather": BLOCK_SIZES}
    for backend, block_sizes in sizes.items():
        accepted[backend] = {}
        for bs in block_sizes:
            problem = attention.probe(attention.backend(backend), dev, bs, torch.bfloat16, torch.bfloat16)
            accepted[backend][str(bs)] = problem or "ok"
    row["block_sizes"] = accepted
    fp8 = attention.probe(attention.TritonBackend, dev, 16, torch.bfloat16, torch.float8_e4m3fn)
    row["triton_fp8_kv"] = fp8 or "ok"
    row["auto_backend_bs16"] = attention.select_backend(dev, 16, torch.bfloat16).name


def copy_bandwidth(device: str) -> float:
    """Bytes read plus written per second by a device-to-device copy of 1 GiB (256 MiB on CPU)."""
    n = (256 << 20) if device == "cpu" else (1 << 30)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    reps = 3 if device == "cpu" else 20
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    return 2 * n * reps / (time.perf_counter() - start)


# -- phase 1 ---------------------------------------------------------------------------------------


def write_checkpoint(row: dict[str, Any], model_dir: Path, shape: dict[str, Any], device: str) -> None:
    start = time.perf_counter()
    make_tiny_checkpoint(model_dir, seed=0, device=device, **shape)
    row["checkpoint_s"] = round(time.perf_counter() - start, 1)
    size = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    row["checkpoint_gb"] = round(size / 1e9, 2)
    row["parameters_b"] = round(size / 2 / 1e9, 3)


def start_engine(
    model_dir: Path, device: str, smoke: bool, **settings: Any
) -> tuple[LLMEngine, dict[str, Any]]:
    start = time.perf_counter()
    engine = LLMEngine(
        model_dir,
        dtype="auto",
        device=device,
        max_batch_size=64,
        max_num_batched_tokens=2048 if smoke else 8192,
        gpu_memory_utilization=0.85,
        **settings,
    )
    runner = engine.runner
    info = {
        "settings": settings,
        "load_s": round(time.perf_counter() - start, 2),
        "backend": runner.backend.name,
        "kernels": runner.kernels,
        "block_size": runner.block_size,
        "graphs": sorted(runner.graphs),
        "kv_blocks": runner.num_blocks,
        "kv_gib": round(runner.num_blocks * runner.bytes_per_block / 2**30, 2),
    }
    if device == "cuda":
        free, total = torch.cuda.mem_get_info()
        info["gpu_free_gib_after_start"] = round(free / 2**30, 1)
        info["gpu_total_gib"] = round(total / 2**30, 1)
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    return engine, info


# -- phase 2 and 3 ---------------------------------------------------------------------------------


def greedy_with_logprobs(
    engine: LLMEngine, inputs: list[list[int]], new: int
) -> list[list[tuple[int, float]]]:
    """Each prompt's greedy tokens with the engine's logprob of each."""
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, logprobs=0)
    got: dict[str, list[tuple[int, float]]] = {}
    for i, p in enumerate(inputs):
        rid = f"check-{time.monotonic_ns()}-{i}"
        got[rid] = []
        engine.add_request(rid, p, params)
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id in got:
                lps = out.logprobs or []
                got[out.request_id].extend(
                    (tok, lp.logprob) for tok, lp in zip(out.new_token_ids, lps, strict=True)
                )
    return list(got.values())


@torch.inference_mode()
def teacher_forced(
    model_dir: Path,
    device: str,
    dtype: torch.dtype,
    inputs: list[list[int]],
    outputs: list[list[tuple[int, float]]],
) -> list[torch.Tensor]:
    """transformers' log-probabilities at each generated position (prompt + engine's output fed in)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    rows = []
    for prompt, out in zip(inputs, outputs, strict=True):
        ids = torch.tensor([prompt + [t for t, _ in out]], device=device)
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        rows.append(torch.log_softmax(logits, dim=-1).cpu())
    del model
    release(device)
    return rows


def score(
    truth: list[torch.Tensor], chosen: list[list[int]], logprobs: list[list[float]], margin: float
) -> dict[str, Any]:
    """How close one run is to the float32 truth, at the positions the engine generated: its tokens
    against the true argmax (a flip is a near-tie when the true gap is within ``margin``) and its
    logprobs of the engine's tokens against the true ones."""
    positions = argmax = near_ties = 0
    errors: list[float] = []
    flips = []
    for i, (lps, toks, lp_row) in enumerate(zip(truth, chosen, logprobs, strict=True)):
        for pos, tok in enumerate(toks):
            positions += 1
            best = int(lps[pos].argmax())
            errors.append(abs(float(lps[pos, tok]) - lp_row[pos]))
            gap = float(lps[pos, best] - lps[pos, tok])
            if tok == best:
                argmax += 1
            elif gap <= margin:
                near_ties += 1
            else:
                flips.append(
                    {"prompt": i, "position": pos, "token": tok, "true_argmax": best, "gap": round(gap, 4)}
                )
    return {
        "positions": positions,
        "argmax_equal": argmax,
        "near_ties": near_ties,
        "beyond_margin": len(flips),
        "flips": flips[:5],
        "mean_abs_logprob_error": round(sum(errors) / max(len(errors), 1), 5),
        "max_abs_logprob_error": round(max(errors, default=0.0), 5),
    }


def compare_logits(
    row: dict[str, Any],
    model_dir: Path,
    device: str,
    inputs: list[list[int]],
    outputs: list[list[tuple[int, float]]],
    margin: float,
) -> None:
    """The engine (bfloat16) and transformers in bfloat16, each against transformers in float32 on
    the same tokens: a random model of 20 layers amplifies rounding, so bfloat16 itself is the
    yardstick. Passes when the engine is as close to the truth as transformers' own bfloat16 run:
    mean logprob error within 1.5x of it (+0.01), argmax agreement within 2 % of it."""
    truth = teacher_forced(model_dir, device, torch.float32, inputs, outputs)
    half = teacher_forced(model_dir, device, torch.bfloat16, inputs, outputs)
    tokens = [[t for t, _ in out] for out in outputs]
    engine = score(truth, tokens, [[lp for _, lp in out] for out in outputs], margin)
    hf_tokens = [[int(r[p].argmax()) for p in range(len(toks))] for r, toks in zip(half, tokens, strict=True)]
    hf_logprobs = [[float(r[p, t]) for p, t in enumerate(toks)] for r, toks in zip(half, tokens, strict=True)]
    transformers_bf16 = score(truth, hf_tokens, hf_logprobs, margin)
    row.update(engine=engine, transformers_bf16=transformers_bf16, margin=margin)
    close = engine["mean_abs_logprob_error"] <= 1.5 * transformers_bf16["mean_abs_logprob_error"] + 0.01
    agree = engine["argmax_equal"] >= transformers_bf16["argmax_equal"] - 0.02 * engine["positions"]
    row["ok"] = close and agree


def graphs_vs_eager(
    row: dict[str, Any], engine: LLMEngine, inputs: list[list[int]], new: int, device: str
) -> None:
    runner = engine.runner
    row["graphs"] = sorted(runner.graphs)
    with_graphs = greedy_with_logprobs(engine, inputs, new)
    t_graphs = decode_step_time(engine, 16, new, device)
    captured, runner.graphs = runner.graphs, {}
    try:
        eager = greedy_with_logprobs(engine, inputs, new)
        t_eager = decode_step_time(engine, 16, new, device)
    finally:
        runner.graphs = captured
    pairs = [(a, b) for x, y in zip(with_graphs, eager, strict=True) for a, b in zip(x, y, strict=True)]
    same = sum(a[0] == b[0] for a, b in pairs)
    # Positions up to each output's first difference: what follows a flipped token differs by design.
    diffs = []
    for x, y in zip(with_graphs, eager, strict=True):
        for a, b in zip(x, y, strict=True):
            if a[0] != b[0]:
                break
            diffs.append(abs(a[1] - b[1]))
    row.update(
        tokens_equal=same,
        positions=len(pairs),
        max_logprob_diff=round(max(diffs, default=0.0), 4),
        step_ms_graphs=round(t_graphs * 1e3, 3),
        step_ms_eager=round(t_eager * 1e3, 3),
        breakdown={n: step_breakdown(engine, n, new, device) for n in (1, 64)},
    )
    row["ok"] = bool(row["graphs"]) or device == "cpu"
    row["ok"] = row["ok"] and same >= 0.95 * len(pairs) and row["max_logprob_diff"] <= 0.05


def decode_step_time(engine: LLMEngine, streams: int, new: int, device: str) -> float:
    """Seconds per step of ``streams`` sequences decoding together (prefill excluded)."""
    work = prompts(streams, 32, seed=7)
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(work):
        engine.add_request(f"steps-{time.monotonic_ns()}-{i}", p, params)
    engine.step()  # the prefill
    sync(device)
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    sync(device)
    return (time.perf_counter() - start) / max(steps, 1)


def step_breakdown(engine: LLMEngine, streams: int, new: int, device: str) -> dict[str, float]:
    """Where a decode step's time goes: the model (graph replay or forward, timed to the device's
    completion) and everything else of ``LLMEngine.step`` (scheduling, inputs, sampling, outputs).
    The model is ``ModelRunner.launch``, what the engine's step calls (it collects the logits
    after), so the hook is on the code that runs; a step that never reached it reads 0 and fails."""
    runner = engine.runner
    launch = runner.launch
    spent = [0.0]
    launched = [0]

    def timed(step: Any) -> Any:
        sync(device)
        start = time.perf_counter()
        out = launch(step)
        sync(device)
        spent[0] += time.perf_counter() - start
        launched[0] += 1
        return out

    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts(streams, 32, seed=9)):
        engine.add_request(f"split-{time.monotonic_ns()}-{i}", p, params)
    engine.step()  # the prefill
    runner.launch = timed  # type: ignore[method-assign]
    try:
        steps, start = 0, time.perf_counter()
        while engine.has_unfinished():
            engine.step()
            steps += 1
        total = time.perf_counter() - start
    finally:
        runner.launch = launch  # type: ignore[method-assign]
    if not launched[0]:
        raise RuntimeError("step_breakdown: the engine's steps never called ModelRunner.launch")
    steps = max(steps, 1)
    return {
        "streams": streams,
        "step_ms": round(total / steps * 1e3, 3),
        "model_ms": round(spent[0] / steps * 1e3, 3),
        "rest_ms": round((total - spent[0]) / steps * 1e3, 3),
    }


def profile_steps(row: dict[str, Any], engine: LLMEngine, device: str, steps: int = 20) -> None:
    """The GPU kernels of ``steps`` decode steps at 1 and 64 streams, with graphs and without:
    kernel time per step against wall time per step, and the kernels that take it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    runner = engine.runner
    for graphs in (True, False):
        captured = runner.graphs
        if not graphs:
            runner.graphs = {}
        try:
            for n in (1, 64):
                params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
                for i, p in enumerate(prompts(n, 64, seed=11)):
                    engine.add_request(f"prof-{time.monotonic_ns()}-{i}", p, params)
                for _ in range(4):  # the prefill, then warm decode steps
                    engine.step()
                sync(device)
                start = time.perf_counter()
                with profile(activities=activities) as prof:
                    for _ in range(steps):
                        engine.step()
                    sync(device)
                wall = (time.perf_counter() - start) / steps
                while engine.has_unfinished():
                    engine.step()
                gpu = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
                gpu.sort(key=lambda e: -e.self_device_time_total)
                kernel_us = sum(e.self_device_time_total for e in gpu) / steps
                row[f"{'graphs' if graphs else 'eager'}_{n}"] = {
                    "wall_ms_per_step": round(wall * 1e3, 3),
                    "kernel_ms_per_step": round(kernel_us / 1e3, 3),
                    "kernels_per_step": round(sum(e.count for e in gpu) / steps, 1),
                    "top": [
                        {
                            "kernel": e.key[:100],
                            "calls_per_step": round(e.count / steps, 1),
                            "us_per_step": round(e.self_device_time_total / steps, 1),
                        }
                        for e in gpu[:15]
                    ],
                }
        finally:
            runner.graphs = captured


# -- phase 4 ---------------------------------------------------------------------------------------


def throughput(engine: LLMEngine, streams: int, prompt_len: int, new: int, device: str) -> dict[str, float]:
    work = prompts(streams, prompt_len, seed=streams)
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    sync(device)
    start = time.perf_counter()
    outs = engine.generate(work, params)
    sync(device)
    seconds = time.perf_counter() - start
    return {"tok_s": sum(len(o) for o in outs) / seconds, "seconds": seconds, "step_s": seconds / new}


def bandwidth_fraction(
    engine: LLMEngine, streams: int, prompt_len: int, new: int, step_s: float, copy_bps: float
) -> float:
    """Bytes a decode step must read (every weight once, each stream's KV at its mean length) over
    the step time, as a fraction of the measured copy bandwidth."""
    weights = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    runner = engine.runner
    kv_per_token = runner.bytes_per_block / runner.block_size
    kv = streams * (prompt_len + new / 2) * kv_per_token
    return (weights + kv) / step_s / copy_bps


def throughput_rows(
    row: dict[str, Any], model_dir: Path, device: str, smoke: bool, copy_bps: float, deadline: float
) -> None:
    streams = (1, 4) if smoke else (1, 16, 64)
    prompt_len, new = (32, 16) if smoke else (128, 256)
    variants: list[dict[str, Any]] = [{}]
    if not smoke:
        dev = torch.device(device)
        variants = [{"attention_backend": "triton"}, {"attention_backend": "triton", "kv_cache_dtype": "fp8"}]
        flash = [
            bs
            for bs in BLOCK_SIZES
            if not attention.probe(attention.FlashVarlenBackend, dev, bs, torch.bfloat16, torch.bfloat16)
        ]
        if flash:
            variants.append({"attention_backend": "flash-varlen", "block_size": flash[0]})
        variants.append({"attention_backend": "sdpa-gather"})
    row["streams"], row["prompt_len"], row["new_tokens"] = streams, prompt_len, new
    row["variants"] = []
    for settings in variants:
        if time.perf_counter() > deadline:
            row["variants"].append({"settings": settings, "skipped": "the phase's time ran out"})
            continue
        engine, info = start_engine(model_dir, device, smoke, **settings)
        try:
            for n in streams:
                r = throughput(engine, n, prompt_len, new, device)
                info[f"tok_s_{n}"] = round(r["tok_s"], 1)
                info[f"step_ms_{n}"] = round(r["step_s"] * 1e3, 3)
                info[f"hbm_fraction_{n}"] = round(
                    bandwidth_fraction(engine, n, prompt_len, new, r["step_s"], copy_bps), 3
                )
        finally:
            engine.shutdown()
            del engine
            release(device)
        row["variants"].append(info)
        print(f"    {info}", flush=True)


# -- phase 5 ---------------------------------------------------------------------------------------


def vllm_baseline(row: dict[str, Any], model_dir: Path, smoke: bool, deadline_s: int) -> None:
    """vLLM in its own process (its own environment: ``$VLLM_PYTHON`` or this Python when it has
    vLLM), dummy weights of the checkpoint's shape, the same 16-stream load as phase 4."""
    python = os.environ.get("VLLM_PYTHON", sys.executable)
    has = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if has.returncode != 0:
        row["ran"] = False
        row["reason"] = f"vllm is not importable by {python}: {has.stderr.strip().splitlines()[-1:]}"
        row["ok"] = True  # a missing peer is reported, not a failure of the engine
        return
    script = (
        "import json, time, sys\n"
        "from vllm import LLM, SamplingParams\n"
        f"llm = LLM(model={str(model_dir)!r}, load_format='dummy', dtype='bfloat16', gpu_memory_utilization=0.85,"
        " skip_tokenizer_init=True)\n"
        "import random\nrng = random.Random(16)\n"
        "prompts = [{'prompt_token_ids': [rng.randrange(8, 4096) for _ in range(128)]} for _ in range(16)]\n"
        "p = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)\n"
        "llm.generate(prompts[:1], p)\n"
        "t = time.perf_counter(); outs = llm.generate(prompts, p); s = time.perf_counter() - t\n"
        "print(json.dumps({'tok_s_16': sum(len(o.outputs[0].token_ids) for o in outs) / s}))\n"
    )
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=deadline_s)
    row["ran"] = proc.returncode == 0
    if proc.returncode == 0:
        row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    else:
        row["ok"] = False
        row["stderr_tail"] = proc.stderr[-2000:]


# -- the run ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "gpu-check-results")))
    parser.add_argument("--smoke", action="store_true", help="the same phases on CPU with a 5M model")
    parser.add_argument("--new", type=int, default=32, help="greedy tokens per prompt in phases 2 and 3")
    parser.add_argument("--profile", action="store_true", help="only phases 0, 1 and a kernel profile (6)")
    parser.add_argument(
        "--margin", type=float, default=0.25, help="logprob gap under which a flip is a near-tie"
    )
    parser.add_argument(
        "--logprob-tol", type=float, default=0.25, help="largest chosen-token logprob difference"
    )
    args = parser.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device (use --smoke on CPU)")
    check = Check(args.out_dir, args.smoke)
    device, shape = check.device, (SMOKE_SHAPE if args.smoke else SHAPE)
    limits = {"env": 30, "start": 90, "logits": 60, "graphs": 60, "throughput": 180, "vllm": 120}
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.new = min(args.new, 8)
    eq = equality_prompts()
    engine: LLMEngine | None = None
    tmp = Path(tempfile.mkdtemp(prefix="frontier-gpu-check-"))
    model_dir = tmp / "llama"
    try:
        with check.phase(0, "env", limits["env"]) as row:
            environment(row, device)
        with check.phase(1, "start", limits["start"]) as row:
            write_checkpoint(row, model_dir, shape, device)
            engine, info = start_engine(model_dir, device, args.smoke)
            row.update(info)
        if args.profile:
            with check.phase(6, "profile", 120) as row:
                if engine is None:
                    raise RuntimeError("no engine: phase 1 failed")
                profile_steps(row, engine, device)
        else:
            with check.phase(2, "logits", limits["logits"]) as row:
                if engine is None:
                    raise RuntimeError("no engine: phase 1 failed")
                outputs = greedy_with_logprobs(engine, eq, args.new)
                row["prompts"], row["new_tokens"] = len(eq), args.new
                compare_logits(row, model_dir, device, eq, outputs, args.margin)
            with check.phase(3, "graphs", limits["graphs"]) as row:
                if engine is None:
                    raise RuntimeError("no engine: phase 1 failed")
                graphs_vs_eager(row, engine, eq, args.new, device)
            if engine is not None:
                engine.shutdown()
                engine = None
                release(device)
            with check.phase(4, "throughput", limits["throughput"]) as row:
                copy_bps = check.results["env"]["copy_gb_s"] * 1e9
                throughput_rows(
                    row,
                    model_dir,
                    device,
                    args.smoke,
                    copy_bps,
                    time.perf_counter() + limits["throughput"] - 40,
                )
            with check.phase(5, "vllm", limits["vllm"]) as row:
                if args.smoke:
                    row.update(ran=False, reason="not in a smoke run (CPU)")
                else:
                    vllm_baseline(row, model_dir, args.smoke, limits["vllm"] - 10)
    finally:
        if engine is not None:
            engine.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {name: r.get("ok", False) for name, r in check.results.items()}
    total = round(time.perf_counter() - check.started, 1)
    (check.out_dir / "summary.json").write_text(
        json.dumps({"ok": all(summary.values()), "phases": summary, "seconds": total}, indent=2) + "\n"
    )
    print(
        f"gpu_check ok={all(summary.values())} "
        + " ".join(f"{k}={v}" for k, v in summary.items())
        + f" total={total}s"
    )
    sys.exit(0 if all(summary.values()) else 1)


if __name__ == "__main__":
    main()
