"""The roofline's prediction against measurement on this machine.

    python bench/roofline_vs_measured.py [--threads 1] [--repeats 3] [--prompt 32] [--output 32]

Three checkpoints written on the fly: the tiny model (``frontier_runtime.tiny``: hidden 256, 4
layers, 8/4 heads, vocab 4096; 5M parameters), a ~100M-parameter Llama with GQA (hidden 768, 12
layers, 12 query / 4 KV heads, MLP 2048, vocab 16384) and a Mixtral-style mixture of experts
written by transformers (hidden 512, 4 layers, 8 experts of width 1024, top-2; 59M parameters,
18M active per token), all float32.

- measured: decode output tokens/s of ``LLMEngine`` at concurrency 1, 8 and 32 — all requests
  submitted at once, greedy, EOS ignored; the clock starts after the step that prefills every
  prompt, so only decode steps count. Each step is timed by the CPU time of the thread that runs
  it (with ``--threads 1`` torch runs every op on that thread): on a machine shared with other
  work, the wall clock would count the time spent waiting for a core. The median step over
  ``--repeats`` runs sets the figure; the wall-clock median is printed beside it.
- predicted: ``roofline.decode_tokens_per_s`` with the CPU as ``fab plan`` models it
  (``frontier.capacity.cpu``): the engine's own linear layer streaming weights at one row and
  multiplying at 32 rows, measured again right before each run (the best of those measurements
  is used), and the engine's overhead per layer and per sequence fitted on this run's own tiny rows
  at concurrency 1 and 32 (as ``cpu.fit_engine_overhead`` fits it: those two rows are in-sample,
  the others held out; a fit taken at another moment of a shared machine carried that moment's
  load into every tiny row); beside it the bare roofline with no overhead.
- the sparse layer: the engine runs one GEMM per expert in use, one after another, each computing
  whole 8-row tiles (the panel GEMM's register tile), so each expert GEMM is its own roofline over
  its Binomial(B, k / E) rows, padded; the engine's own time per sparse layer (routing, sorting,
  gathering, adding back) and per expert GEMM is fitted once at the start
  (``cpu.fit_moe_overhead``) on another checkpoint, the tiny model with 8 experts of width 512,
  top-2: every Mixtral row is held out.
- the local stack's knee: the roofline's best point of ``stacks/Pulumi.local.yaml`` (uncalibrated)
  against ``stacks/baselines/local.json``, which ``fab loadtest`` measured through the server
  (HTTP, streaming, one thread per replica).

The last line is exactly ``roofline_vs_measured: max_abs_err=<r> mean_abs_err=<r> within_30pct=<k>/<n>``,
and a line before it names every row outside 30 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.requests import SamplingParams
from frontier_runtime.tiny import make_tiny_checkpoint
from safetensors.torch import load_file

from frontier.capacity import cpu
from frontier.capacity.baseline import load_baseline
from frontier.capacity.cpu import clock
from frontier.capacity.devices import cpu_efficiency, cpu_threads
from frontier.capacity.roofline import Device, Efficiency, Replica, decode_tokens_per_s, fit_slo, step
from frontier.config.load import chosen_pool
from frontier.targets import load_stack

CONCURRENCY = (1, 8, 32)
MODELS = {
    "tiny (5M)": {},
    "llama-100M GQA": {
        "hidden_size": 768,
        "num_layers": 12,
        "num_heads": 12,
        "num_kv_heads": 4,
        "intermediate_size": 2048,
        "vocab_size": 16384,
        "initializer_range": 0.02,
    },
    "mixtral-8x top-2 (59M)": {
        "model_type": "mixtral",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 1024,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 1024,
    },
}
IN_SAMPLE = {("tiny (5M)", 1), ("tiny (5M)", 32)}


@dataclass(frozen=True)
class Row:
    what: str
    predicted: float
    bare: float | None  # the roofline with no engine overhead
    measured: float
    unit: str
    in_sample: bool

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


@dataclass(frozen=True)
class Run:
    """One model at one concurrency, measured, with the CPU as measured right before it."""

    model: str
    concurrency: int
    replica: Replica
    device: Device
    measured: float  # tok/s


def fit_overhead(fit: list[Run], bare: Efficiency, context: float) -> tuple[float, float]:
    """Per layer and per sequence from the two runs' step times less their bare roofline, as
    ``cpu.fit_engine_overhead`` fits its own measurement."""
    residual = {
        r.concurrency: r.concurrency / r.measured
        - step(r.device, bare, r.replica, decode_seqs=r.concurrency, context=context).total_s
        for r in fit
    }
    return cpu.overhead_line(residual, fit[0].replica.shape.layers)


def write_checkpoint(out: Path, shape: dict) -> Path:
    """The tiny writer's checkpoint, or, for a ``model_type``, the one transformers writes for a
    random model of that family (weights std 0.1, so the router's choices are not all ties)."""
    if "model_type" not in shape:
        return make_tiny_checkpoint(out, **shape)
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in shape.items() if k != "model_type"}
    config = AutoConfig.for_model(shape["model_type"], **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(
                (1.0 + 0.1 * torch.randn_like(param))
                if name.endswith("norm.weight")
                else 0.1 * torch.randn_like(param)
            )
    model.save_pretrained(out)
    return out


def replica_of(model_dir: Path, max_batch: int) -> Replica:
    return cpu.replica_of_config(json.loads((model_dir / "config.json").read_text()), max_batch)


def cpu_device(threads: int) -> Device:
    bandwidth, flops, kernel = cpu.measure_kernels(threads)
    return Device(
        f"CPU, {threads} thread(s)", 16e9, bandwidth, flops, bandwidth, f"the engine's {kernel} GEMM"
    )


def best_device(devices: list[Device]) -> Device:
    """The least disturbed of several measurements: the highest bandwidth and FLOP/s seen."""
    bandwidth, flops = max(d.bandwidth for d in devices), max(d.flops for d in devices)
    return replace(devices[0], bandwidth=bandwidth, flops=flops, link_bandwidth=bandwidth)


def measure_decode(
    engine: LLMEngine, vocab: int, concurrency: int, prompt: int, output: int, threads: int
) -> list[tuple[float, float]]:
    """(CPU-clock seconds, wall seconds) of each decode step of ``concurrency`` requests run
    together (prefill excluded); every step decodes one token of each."""
    now = clock(threads)
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    for i in range(concurrency):
        ids = [8 + (i * 131 + j * 17) % (vocab - 8) for j in range(prompt)]  # distinct: no prefix hits
        engine.add_request(f"c{concurrency}-{time.monotonic_ns()}-{i}", ids, params)
    engine.step()  # every prompt fits the budget: this step prefills them all and samples token 1
    steps = []
    while engine.has_unfinished():
        start, wall = now(), time.perf_counter()
        tokens = sum(len(out.new_token_ids) for out in engine.step())
        steps.append((now() - start, time.perf_counter() - wall))
        assert tokens == concurrency, f"a decode step produced {tokens} tokens, expected {concurrency}"
    return steps


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for the engine and the micro-benchmark"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--output", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]

    print(f"{os.cpu_count()} cores, {args.threads} thread(s); load average {load_before:.2f}", flush=True)
    seen: list[Device] = []  # every CPU measurement, for the local knee at the end
    fitted = cpu.measure(args.threads)
    eff = cpu_efficiency(fitted)
    print(
        f"the CPU as fab plan models it: the engine's {fitted.kernel} GEMM streams weights at "
        f"{fitted.bandwidth / 1e9:.1f} GB/s and multiplies at {fitted.flops / 1e9:.1f} GFLOP/s; engine overhead "
        f"fitted on the tiny model: {fitted.layer_overhead_s * 1e3:.3f} ms/layer + {fitted.seq_overhead_s * 1e3:.3f} "
        f"ms/sequence per step; a sparse layer (fitted on a tiny 8-expert model, rows in tiles of "
        f"{fitted.gemm_row_tile}): {fitted.moe_layer_overhead_s * 1e3:.3f} ms + "
        f"{fitted.expert_overhead_s * 1e3:.3f} ms/expert GEMM; server (knee row only): "
        f"{fitted.request_overhead_s * 1e3:.2f} ms/request + {fitted.token_overhead_s * 1e3:.3f} ms/streamed token",
        flush=True,
    )
    # The engine rows run LLMEngine with no server: the server's terms are the knee row's only.
    engine_eff = replace(eff, request_overhead_s=0.0, token_overhead_s=0.0)
    bare_eff = replace(
        engine_eff,
        step_overhead_s=0.0,
        seq_overhead_s=0.0,
        layer_overhead_s=0.0,
        moe_layer_overhead_s=0.0,
        expert_overhead_s=0.0,
    )
    context = args.prompt + args.output / 2
    rows: list[Row] = []
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="frontier-roofline-") as tmp:
        for name, shape in MODELS.items():
            model_dir = write_checkpoint(Path(tmp) / name.split()[0], shape)
            cfg = json.loads((model_dir / "config.json").read_text())
            replica = replica_of(model_dir, max(CONCURRENCY))
            # matmul weights + the input embedding (untied) + the norms
            params = sum(t.numel() for f in model_dir.glob("*.safetensors") for t in load_file(f).values())
            print(f"{name}: {params / 1e6:.1f}M parameters", flush=True)
            engine = LLMEngine(
                model_dir,
                max_batch_size=max(CONCURRENCY),
                max_num_batched_tokens=2048,
                cpu_kv_cache_bytes=512 << 20,
                cpu_threads=args.threads,
            )
            engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
            for c in CONCURRENCY:
                # The CPU is measured right before each run, so both sides of a row see the same
                # moments of a shared machine.
                steps, cpus = [], []
                for _ in range(args.repeats):
                    cpus.append(cpu_device(args.threads))
                    steps += measure_decode(
                        engine, cfg["vocab_size"], c, args.prompt, args.output, args.threads
                    )
                measured = c / median([cpu_s for cpu_s, _ in steps])
                wall = c / median([wall_s for _, wall_s in steps])
                device = best_device(cpus)
                seen.extend(cpus)
                runs.append(Run(name, c, replica, device, measured))
                print(
                    f"  concurrency {c}: measured {measured:,.1f} tok/s (wall clock: {wall:,.1f}) "
                    f"(CPU copy {device.bandwidth / 1e9:.1f} GB/s, matmul {device.flops / 1e9:.1f} GFLOP/s)",
                    flush=True,
                )
            engine.shutdown()

    # The engine's overhead per layer and per sequence, fitted on this run's own tiny rows at
    # concurrency 1 and 32 (those two rows are in-sample; every other row is held out): a fit taken
    # at another moment of a shared machine would carry that moment's load into every tiny row.
    per_layer, per_seq = fit_overhead(
        [r for r in runs if (r.model, r.concurrency) in IN_SAMPLE], bare_eff, context
    )
    engine_eff = replace(engine_eff, layer_overhead_s=per_layer, seq_overhead_s=per_seq)
    print(
        f"engine overhead fitted on this run's tiny rows: {per_layer * 1e3:.3f} ms/layer + "
        f"{per_seq * 1e3:.3f} ms/sequence per step",
        flush=True,
    )
    for r in runs:
        rows.append(
            Row(
                f"{r.model} decode, concurrency {r.concurrency}",
                decode_tokens_per_s(r.device, engine_eff, r.replica, r.concurrency, context),
                decode_tokens_per_s(r.device, bare_eff, r.replica, r.concurrency, context),
                r.measured,
                "tok/s",
                (r.model, r.concurrency) in IN_SAMPLE,
            )
        )

    local = load_stack("local")
    pool = chosen_pool(local)
    baseline = load_baseline("local")
    if baseline is not None:
        # The stack's runtime uses runtime.cpu_threads (1): the model of its replica, uncalibrated.
        local_cpu = best_device(seen) if args.threads == cpu_threads(pool) else cpu_device(cpu_threads(pool))
        cap = local.capacity
        knee = fit_slo(
            local_cpu,
            eff,
            Replica.from_pool(pool),
            local.slo,
            cap.avg_prompt_tokens,
            cap.avg_output_tokens,
        ).best
        predicted_knee = knee.requests_per_s if knee is not None else 0.0
        rows.append(
            Row(
                "local stack knee (server, 1 thread)",
                predicted_knee,
                None,
                baseline.replica_qps,
                "req/s",
                False,
            )
        )

    load_after = os.getloadavg()[0]
    print()
    header = f"{'':38} {'predicted':>10} {'no overhead':>12} {'measured':>10} {'unit':>6} {'error':>8}"
    print(header)
    for r in rows:
        bare = f"{r.bare:,.1f}" if r.bare is not None else "-"
        mark = " (fit)" if r.in_sample else ""
        print(
            f"{r.what:38} {r.predicted:>10,.1f} {bare:>12} {r.measured:>10,.1f} {r.unit:>6} {r.error:>+8.0%}{mark}"
        )
    print(
        f"(load average {load_before:.2f} before, {load_after:.2f} after, on {os.cpu_count()} cores shared with "
        "other work; '(fit)' rows set the overhead defaults, the others are held out)"
    )
    errors = [abs(r.error) for r in rows]
    within = sum(e <= 0.30 for e in errors)
    outside = [f"{r.what} ({r.error:+.0%})" for r in rows if abs(r.error) > 0.30]
    print("outside 30 %: " + ("; ".join(outside) if outside else "none"))
    print(
        f"roofline_vs_measured: max_abs_err={max(errors):.2f} mean_abs_err={sum(errors) / len(errors):.2f} "
        f"within_30pct={within}/{len(errors)}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
