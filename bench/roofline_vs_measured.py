"""The roofline's prediction against measurement on this machine.

    python bench/roofline_vs_measured.py [--threads 1] [--repeats 3] [--prompt 32] [--output 32]

Two checkpoints written on the fly with ``frontier_runtime.tiny.make_tiny_checkpoint``: the tiny
model (hidden 256, 4 layers, 8/4 heads, vocab 4096; 5M parameters) and a ~100M-parameter Llama with
GQA (hidden 768, 12 layers, 12 query / 4 KV heads, MLP 2048, vocab 16384), both float32.

- measured: decode output tokens/s of ``LLMEngine`` at concurrency 1, 8 and 32 — all requests
  submitted at once, greedy, EOS ignored; the clock starts after the step that prefills every
  prompt, so only decode steps count. Each step is timed by the CPU time of the thread that runs
  it (with ``--threads 1`` torch runs every op on that thread): on a machine shared with other
  work, the wall clock would count the time spent waiting for a core. The median step over
  ``--repeats`` runs sets the figure; the wall-clock median is printed beside it.
- predicted: ``roofline.decode_tokens_per_s`` on the CPU measured by ``frontier.capacity.cpu``
  (a large copy and a matmul, at the same thread count and on the same clock) right before each
  of those runs, the best of those measurements — with the efficiencies of
  ``frontier.capacity.devices.CPU_EFFICIENCY``; and, to show what the engine's own time is worth,
  the bare roofline with no overhead.
- the local stack's knee: the roofline's best point of ``stacks/Pulumi.local.yaml`` (uncalibrated:
  the defaults, not fitted to the baseline) against ``stacks/baselines/local.json``, which
  ``fab loadtest`` measured through the server (HTTP, streaming, one thread per replica).

It also fits the engine-overhead terms (per layer and per sequence, per step) to the tiny model
at concurrency 1 and 32 — the source of the defaults, so those two rows are in-sample; the 100M
model and the knee are held out — and prints the fit.
The last line is exactly ``roofline_vs_measured: max_abs_err=<r> mean_abs_err=<r> within_30pct=<k>/<n>``.
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

from frontier.capacity.baseline import load_baseline
from frontier.capacity.cpu import clock, measure
from frontier.capacity.devices import CPU_EFFICIENCY, cpu_threads
from frontier.capacity.roofline import Device, Replica, Shape, decode_tokens_per_s, fit_slo
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


def replica_of(model_dir: Path, max_batch: int) -> Replica:
    cfg = json.loads((model_dir / "config.json").read_text())
    shape = Shape(
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        intermediate=cfg["intermediate_size"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        vocab=cfg["vocab_size"],
        dtype_bytes=4,
    )
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 4
    return Replica(shape, 1, kv_per_token, max_batch, 2048, max_batch, True)


def cpu_device(threads: int) -> Device:
    m = measure(threads)
    return Device(f"CPU, {threads} thread(s)", 16e9, m.bandwidth, m.flops, m.bandwidth, "measured")


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
    eff = CPU_EFFICIENCY
    bare_eff = replace(eff, step_overhead_s=0.0, seq_overhead_s=0.0, layer_overhead_s=0.0)
    context = args.prompt + args.output / 2
    rows: list[Row] = []
    step_times: dict[tuple[str, int], tuple[float, float]] = {}  # measured step s, bare roofline step s
    with tempfile.TemporaryDirectory(prefix="frontier-roofline-") as tmp:
        for name, shape in MODELS.items():
            model_dir = make_tiny_checkpoint(Path(tmp) / name.split()[0], **shape)
            cfg = json.loads((model_dir / "config.json").read_text())
            replica = replica_of(model_dir, max(CONCURRENCY))
            # matmul weights + the input embedding (untied) + the norms
            h = cfg["hidden_size"]
            params = (
                replica.shape.matmul_parameters
                + cfg["vocab_size"] * h
                + (2 * cfg["num_hidden_layers"] + 1) * h
            )
            print(
                f"{name}: {params / 1e6:.1f}M parameters ({replica.shape.matmul_parameters / 1e6:.1f}M in matmuls)"
            )
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
                predicted = decode_tokens_per_s(device, eff, replica, c, context)
                bare = decode_tokens_per_s(device, bare_eff, replica, c, context)
                step_times[(name, c)] = (c / measured, c / bare)
                rows.append(
                    Row(
                        f"{name} decode, concurrency {c}",
                        predicted,
                        bare,
                        measured,
                        "tok/s",
                        (name, c) in IN_SAMPLE,
                    )
                )
                print(
                    f"  concurrency {c}: measured {measured:,.1f} tok/s (wall clock: {wall:,.1f}), "
                    f"predicted {predicted:,.1f} "
                    f"(CPU copy {device.bandwidth / 1e9:.1f} GB/s, matmul {device.flops / 1e9:.1f} GFLOP/s)",
                    flush=True,
                )
            engine.shutdown()

    # The overhead fit behind CPU_EFFICIENCY: measured step - bare roofline step = b x layers +
    # c x batch, from the tiny model (4 layers) at concurrency 1 and 32.
    residual = {key: measured_s - bare_s for key, (measured_s, bare_s) in step_times.items()}
    tiny_1, tiny_32 = residual[("tiny (5M)", 1)], residual[("tiny (5M)", 32)]
    per_seq = (tiny_32 - tiny_1) / 31
    per_layer = (tiny_1 - per_seq) / 4
    print(
        f"overhead fitted on the tiny model (c=1, c=32): {per_layer * 1e3:.3f} ms/layer + {per_seq * 1e3:.3f} "
        f"ms/sequence per step (CPU_EFFICIENCY uses {eff.layer_overhead_s * 1e3:.3f} + {eff.seq_overhead_s * 1e3:.3f})"
    )

    local = load_stack("local")
    baseline = load_baseline("local")
    if baseline is not None:
        # The stack's runtime uses runtime.cpu_threads (1): the model of its replica, uncalibrated.
        local_cpu = (
            best_device(seen) if args.threads == cpu_threads(local) else cpu_device(cpu_threads(local))
        )
        cap = local.capacity
        knee = fit_slo(
            local_cpu,
            eff,
            Replica.from_settings(local),
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
    print(
        f"roofline_vs_measured: max_abs_err={max(errors):.2f} mean_abs_err={sum(errors) / len(errors):.2f} "
        f"within_30pct={within}/{len(errors)}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
