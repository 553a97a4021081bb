"""The CPU of a local host as a roofline device: measured through the engine's own kernels, not
looked up, and the engine's own time per step fitted on the engine itself.

Three measurements, at the thread count the runtime will use, each the best of several runs:
- bandwidth: one pass over 128 MB of float32 weights through the engine's linear layer
  (``frontier_runtime.models.llama.layers.Linear``, packed as the engine packs it: the panel GEMM
  where the CPU has AVX-512, else oneDNN's layout) with one row of input: the bytes a decode step of
  one sequence streams, per second of that kernel. A plain copy would measure the memory system,
  not what the kernel gets from it (the panel GEMM prefetches ahead of its tiles and reads each
  weight once; torch's BLAS packs a weight before each GEMM and reads it three times).
- FLOP/s: the same layers with 32 rows, a large decode batch (prefill chunks of hundreds of rows run
  10-20 % faster: the model is conservative there).
- the engine's overhead: decode steps of a 4-layer random checkpoint at concurrency 1 and 32 in the
  engine itself, less the bare roofline of those steps on the two figures above, fitted to a time per
  layer and a time per sequence per step (Python dispatching each layer's ops; scheduling, sampling
  and detokenising each sequence).
- the server's overhead: the same checkpoint served by a real runtime process (``python -m
  frontier_runtime serve``, the threads the stack gives it), sent streamed completions one at a
  time, of one token and of many taking turns; the process's CPU time (``/proc/PID/stat``, every
  thread) less the engine's modelled steps, fitted to a time per request and per streamed token.
  On a CPU replica the server and the engine share the cores, so these add to every step.
- the sparse layer's overhead: decode steps of the same checkpoint made a Mixtral (8 experts of
  width 512, top-2) at concurrency 1 and 32, less their roofline with the expert GEMMs run one
  after another in whole row tiles (``roofline.serial_experts_s``; the panel GEMM's tile is 8 rows)
  and the dense fit's time, fitted per layer to a time per sparse layer (router, top-k, sorting the
  token-expert pairs, gathering rows and adding them back) and one per expert GEMM the layer runs
  (2 experts at concurrency 1, nearly all 8 at 32).

The result is cached under ``.frontier/roofline/`` per thread count and machine, so ``fab plan`` pays
for it once. With one thread every run is timed by that thread's CPU time, not the wall clock: on a
machine shared with other work the wall clock counts the time the thread waited for a core, which
says nothing about the core (memory bandwidth taken by the others still shows). With more threads
the work runs on torch's pool, whose time only the wall clock sees.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from frontier.project import state_dir

WIDTH = 2048  # 8 layers of 2048 x 2048 float32: 128 MB, four times the largest last-level cache here
LAYERS = 8
GEMM_ROWS = 32  # a decode batch: the rate the engine reaches on the steps that bound it
REPEATS = 5
# The overhead fit: the tiny checkpoint's default shape (4 layers, hidden 256), decode only.
FIT_CONCURRENCY = (1, 32)
FIT_PROMPT = 16
FIT_OUTPUT = 24
FIT_ROUNDS = 3  # each concurrency's decode run, taking turns
FORMAT = 4  # the cache's format: an older cache is measured again
# The sparse-layer fit: the tiny checkpoint with each MLP made a Mixtral sparse layer of MOE_EXPERTS
# experts of width MOE_WIDTH, each token routed to MOE_TOP_K; decode only, at FIT_CONCURRENCY.
MOE_EXPERTS = 8
MOE_TOP_K = 2
MOE_WIDTH = 512
# Rows the GEMM computes at once, by kernel: the panel GEMM's register tile is 8 rows x 32 columns
# (``frontier_runtime.ops.panel_gemm``), so 9 rows cost what 16 do. oneDNN's and torch's tiling is
# not the engine's to state: 1 (no padding modelled).
ROW_TILE = {"panel": 8}
# The server fit: streamed completions of one token and of SERVER_TOKENS tokens, SERVER_CONCURRENCY at
# once (the local stack's max_batch_size: at its knee the server streams that many together, and the
# interleaved streams, the output thread and the GIL cost more per token than one stream alone).
SERVER_CONCURRENCY = 16
SERVER_REQUESTS = 48
SERVER_TOKENS = 32


@dataclass(frozen=True)
class CpuMeasurement:
    threads: int
    bandwidth: float  # bytes/s: weights streamed by the engine's linear layer at one row
    flops: float  # float32 FLOP/s of the engine's linear layer at GEMM_ROWS rows
    machine: str
    measured_at: str
    clock: str  # "thread CPU time" or "wall"
    kernel: str = ""  # which GEMM the engine's layer ran: panel / onednn / torch
    layer_overhead_s: float = 0.0  # the engine's own time per layer per step
    seq_overhead_s: float = 0.0  # the engine's own time per sequence per step
    request_overhead_s: float = 0.0  # the HTTP server's time per request
    token_overhead_s: float = 0.0  # the HTTP server's time per streamed token
    gemm_row_tile: int = 1  # rows the GEMM computes at once (ROW_TILE)
    moe_layer_overhead_s: float = 0.0  # the engine's own time per sparse layer per step (routing)
    expert_overhead_s: float = 0.0  # the engine's own time per expert GEMM it runs
    format: int = FORMAT


def _machine() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores"


def cache_path(threads: int) -> Path:
    return state_dir() / "roofline" / f"cpu-{threads}-threads.json"


def clock(threads: int) -> Callable[[], float]:
    """The clock that times work on ``threads`` intra-op threads (see the module's note)."""
    return time.thread_time if threads == 1 else time.perf_counter


def _best_s(fn: Callable[[], object], now: Callable[[], float]) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(REPEATS):
        start = now()
        fn()
        best = min(best, now() - start)
    return best


def measure(threads: int) -> CpuMeasurement:
    """Run the measurements now (ten seconds or so)."""
    import torch  # the toolkit needs torch only here; importing it lazily keeps `fab` fast
    from frontier_runtime.tiny import make_tiny_checkpoint

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        bandwidth, flops, kernel = measure_kernels(threads)
        # One checkpoint for both fits: the engine's steps in this process, the server's in its own.
        with tempfile.TemporaryDirectory(prefix="frontier-cpu-fit-") as tmp:
            model_dir = make_tiny_checkpoint(Path(tmp) / "tiny")
            per_layer, per_seq = fit_engine_overhead(model_dir, threads, bandwidth, flops)
            engine = FittedEngine(bandwidth, flops, per_layer, per_seq)
            per_request, per_token = fit_server_overhead(model_dir, threads, engine)
            moe_dir = make_moe_checkpoint(Path(tmp) / "moe")
            tile = ROW_TILE.get(kernel, 1)
            per_moe_layer, per_expert = fit_moe_overhead(moe_dir, threads, engine, tile)
    finally:
        torch.set_num_threads(previous)
    return CpuMeasurement(
        threads=threads,
        bandwidth=bandwidth,
        flops=flops,
        machine=_machine(),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        clock="thread CPU time" if threads == 1 else "wall",
        kernel=kernel,
        layer_overhead_s=per_layer,
        seq_overhead_s=per_seq,
        request_overhead_s=per_request,
        token_overhead_s=per_token,
        gemm_row_tile=tile,
        moe_layer_overhead_s=per_moe_layer,
        expert_overhead_s=per_expert,
    )


def measure_kernels(threads: int) -> tuple[float, float, str]:
    """Bytes/s streamed at one row and FLOP/s at GEMM_ROWS rows by the engine's linear layer, on
    torch's current thread count; and the GEMM's name."""
    import torch

    now = clock(threads)
    layers, kernel = _engine_layers()
    one_row = torch.randn(1, WIDTH)
    many_rows = torch.randn(GEMM_ROWS, WIDTH)
    stream_s = _best_s(lambda: [layer(one_row) for layer in layers], now)
    gemm_s = _best_s(lambda: [layer(many_rows) for layer in layers], now)
    return LAYERS * WIDTH * WIDTH * 4 / stream_s, 2 * GEMM_ROWS * WIDTH * WIDTH * LAYERS / gemm_s, kernel


def _engine_layers() -> tuple[list[Any], str]:
    """LAYERS float32 linear layers laid out exactly as the engine lays out a checkpoint's, and
    the name of the GEMM they run."""
    import torch
    from frontier_runtime.models.llama.layers import Linear

    layers = []
    for _ in range(LAYERS):
        layer = Linear(WIDTH, WIDTH, bias=False)
        with torch.no_grad():
            layer.weight.normal_(0, 0.02)
        layer.use_transposed_weight()
        layer.pack()
        layers.append(layer)
    first = layers[0]
    kernel = "panel" if first.panels else "onednn" if first.packed is not None else "torch"
    return layers, kernel


def fit_engine_overhead(model_dir: Path, threads: int, bandwidth: float, flops: float) -> tuple[float, float]:
    """The engine's own time per layer and per sequence of a decode step: measured steps of the
    4-layer random checkpoint ``model_dir`` at concurrency 1 and 32, less their bare roofline."""
    from frontier.capacity.roofline import step

    cfg = json.loads((model_dir / "config.json").read_text())
    measured = _engine_decode_steps(model_dir, threads)
    replica = replica_of_config(cfg)
    device = _measured_device(bandwidth, flops)
    bare = _fitted("bare")
    context = FIT_PROMPT + FIT_OUTPUT / 2
    residual = {
        c: s - step(device, bare, replica, decode_seqs=c, context=context).total_s
        for c, s in measured.items()
    }
    return overhead_line(residual, replica.shape.layers)


def overhead_line(residual: dict[int, float], layers: int) -> tuple[float, float]:
    """Per layer and per sequence from a decode step's time beyond its bare roofline at two
    concurrencies: a line in the sequences, its intercept spread over the layers."""
    low, high = sorted(residual)
    per_seq = max(0.0, (residual[high] - residual[low]) / (high - low))
    per_layer = max(0.0, (residual[low] - per_seq * low) / layers)
    return per_layer, per_seq


def make_moe_checkpoint(out: Path) -> Path:
    """The tiny checkpoint (``frontier_runtime.tiny``) with each layer's MLP replaced by a Mixtral
    sparse layer: a router and MOE_EXPERTS experts of width MOE_WIDTH, top-MOE_TOP_K, random weights
    of std 0.1 (so the router's choices spread rather than tie)."""
    import torch
    from frontier_runtime.tiny import make_tiny_checkpoint
    from safetensors.torch import load_file, save_file

    model_dir = make_tiny_checkpoint(out, intermediate_size=MOE_WIDTH)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=MOE_EXPERTS,
        num_experts_per_tok=MOE_TOP_K,
    )
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    weights = load_file(model_dir / "model.safetensors")
    hidden, width = cfg["hidden_size"], cfg["intermediate_size"]
    draw = torch.Generator().manual_seed(0)
    for layer in range(cfg["num_hidden_layers"]):
        for name in ("gate_proj", "up_proj", "down_proj"):
            del weights[f"model.layers.{layer}.mlp.{name}.weight"]
        sparse = f"model.layers.{layer}.block_sparse_moe."
        weights[sparse + "gate.weight"] = 0.1 * torch.randn(MOE_EXPERTS, hidden, generator=draw)
        for e in range(MOE_EXPERTS):
            weights[f"{sparse}experts.{e}.w1.weight"] = 0.1 * torch.randn(width, hidden, generator=draw)
            weights[f"{sparse}experts.{e}.w3.weight"] = 0.1 * torch.randn(width, hidden, generator=draw)
            weights[f"{sparse}experts.{e}.w2.weight"] = 0.1 * torch.randn(hidden, width, generator=draw)
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    return model_dir


@dataclass(frozen=True)
class FittedEngine:
    """The CPU as measured (the engine's bandwidth and FLOP/s) and the engine's own time per layer
    and per sequence of a step as fitted on the dense checkpoint: the roofline the later fits (the
    server's overhead, the experts') measure against."""

    bandwidth: float
    flops: float
    per_layer: float
    per_seq: float

    def device(self) -> Any:
        return _measured_device(self.bandwidth, self.flops)

    def efficiency(self, source: str, **terms: Any) -> Any:
        return _fitted(source, self.per_layer, self.per_seq, **terms)


def fit_moe_overhead(
    model_dir: Path, threads: int, engine: FittedEngine, row_tile: int
) -> tuple[float, float]:
    """The engine's own time per sparse layer and per expert GEMM of a decode step: measured steps
    of the sparse checkpoint ``model_dir`` at concurrency 1 and 32, less the roofline of those steps
    (row tiles padded, the dense fit's per-layer and per-sequence time included), per layer, fitted
    to a + e x the experts a layer's tokens touch (k at concurrency 1, nearly all of them at 32)."""
    from frontier.capacity.roofline import experts_touched, step

    cfg = json.loads((model_dir / "config.json").read_text())
    measured = _engine_decode_steps(model_dir, threads)
    replica = replica_of_config(cfg)
    device = engine.device()
    dense = engine.efficiency("dense fit", gemm_row_tile=row_tile, expert_gemms="serial")
    context = FIT_PROMPT + FIT_OUTPUT / 2
    sh = replica.shape
    per_layer_residual = {
        c: (s - step(device, dense, replica, decode_seqs=c, context=context).total_s) / sh.layers
        for c, s in measured.items()
    }
    low, high = FIT_CONCURRENCY
    touched = {c: experts_touched(sh.experts, sh.experts_per_token, c) for c in FIT_CONCURRENCY}
    per_expert = max(
        0.0, (per_layer_residual[high] - per_layer_residual[low]) / (touched[high] - touched[low])
    )
    per_moe_layer = max(0.0, per_layer_residual[low] - per_expert * touched[low])
    return per_moe_layer, per_expert


def _engine_decode_steps(model_dir: Path, threads: int) -> dict[int, float]:
    """The median decode step of ``model_dir`` in the engine at each of FIT_CONCURRENCY."""
    from frontier_runtime.engine.llm_engine import LLMEngine

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    engine = LLMEngine(
        model_dir,
        max_batch_size=max(FIT_CONCURRENCY),
        max_num_batched_tokens=1024,
        cpu_kv_cache_bytes=64 << 20,
        cpu_threads=threads,
    )
    try:
        # The concurrencies take turns, FIT_ROUNDS times: both ends of the fit see the same moments
        # of a shared machine, so what the others take drifts into both rather than into the slope.
        steps: dict[int, list[float]] = {c: [] for c in FIT_CONCURRENCY}
        for round_ in range(FIT_ROUNDS):
            for c in FIT_CONCURRENCY:
                steps[c] += _decode_steps_s(engine, vocab, c, clock(threads), f"fit-{round_}")
        return {c: sorted(s)[len(s) // 2] for c, s in steps.items()}
    finally:
        engine.shutdown()


def _measured_device(bandwidth: float, flops: float) -> Any:
    """The roofline's CPU from the two figures just measured (memory is not what a fit models)."""
    from frontier.capacity.roofline import Device

    return Device("CPU", 16e9, bandwidth, flops, bandwidth, "measured")


def _fitted(source: str, per_layer: float = 0.0, per_seq: float = 0.0, **terms: Any) -> Any:
    """The measured CPU at its full rate (every figure the engine's own), plus the engine's fitted
    time per layer and per sequence: the roofline a fit subtracts from, or fits against."""
    from frontier.capacity.roofline import Efficiency

    return Efficiency(1.0, 1.0, 1.0, 0.0, 0.0, per_seq, source, layer_overhead_s=per_layer, **terms)


def replica_of_config(cfg: dict[str, Any], max_batch: int = max(FIT_CONCURRENCY)) -> Any:
    """The roofline's replica of a float32 checkpoint on one CPU, from its config.json fields
    (Llama-shaped; Mixtral's experts where it has them)."""
    from frontier.capacity.roofline import Replica, Shape

    experts = cfg.get("num_local_experts", 0)
    shape = Shape(
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        intermediate=cfg["intermediate_size"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        vocab=cfg["vocab_size"],
        dtype_bytes=4,
        experts=experts,
        experts_per_token=cfg.get("num_experts_per_tok", 0),
        expert_intermediate=cfg["intermediate_size"] if experts else 0,
    )
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 4
    return Replica(shape, 1, kv_per_token, max_batch, 2048, max_batch, True)


def fit_server_overhead(model_dir: Path, threads: int, engine: FittedEngine) -> tuple[float, float]:
    """The runtime server's own time per request and per streamed token, where it shares the
    engine's cores: a real runtime process's CPU time over streamed completions sent
    ``SERVER_CONCURRENCY`` at a time, less the engine's steps as the roofline models them at that
    batch (with the fitted engine overhead)."""
    import httpx

    from frontier.capacity.roofline import step
    from frontier.capacity.runtime_process import serve_locally

    cfg = json.loads((model_dir / "config.json").read_text())
    with tempfile.TemporaryDirectory(prefix="frontier-cpu-server-") as tmp:
        config = {
            "model": {"name": "fit", "weights_uri": str(model_dir), "max_seq_len": 1024},
            "max_concurrency": SERVER_CONCURRENCY,
            "batch": {"window_ms": 0, "max_batch_size": SERVER_CONCURRENCY, "max_num_batched_tokens": 1024},
            "cpu_kv_cache_bytes": 64 << 20,
            "cpu_threads": threads,
            "log_level": "warning",
            "device": "cpu",
        }
        with serve_locally(config, model_dir, Path(tmp), name="fit") as served:
            client, pid = httpx.Client(base_url=served.url, timeout=60), served.pid
            _completions(client, 4, 4)  # warm-up: first requests pay for lazy imports and caches
            # One-token and many-token completions take turns, so the machine's drift goes into
            # both rather than into their difference.
            one, many = (0.0, 0), (0.0, 0)
            for _ in range(FIT_ROUNDS):
                one = _added(
                    one, _cpu_of(pid, lambda: _completions(client, SERVER_REQUESTS // FIT_ROUNDS, 1))
                )
                many = _added(
                    many,
                    _cpu_of(pid, lambda: _completions(client, SERVER_REQUESTS // FIT_ROUNDS, SERVER_TOKENS)),
                )
            prompt = _prompt_tokens(client)
    replica = replica_of_config(cfg)
    device, fitted = engine.device(), engine.efficiency("fitted")
    c = SERVER_CONCURRENCY  # requests arrive together: a step prefills, then decodes, c of them at once
    prefill_s = (
        step(
            device,
            fitted,
            replica,
            decode_seqs=0,
            prefill_tokens=prompt * c,
            prefill_attended=prompt / 2,
            context=0,
        ).total_s
        / c
    )
    decode_s = step(device, fitted, replica, decode_seqs=c, context=prompt + SERVER_TOKENS / 2).total_s / c
    (cpu_one, tokens_one), (cpu_many, tokens_many) = one, many
    per_token = (cpu_many - cpu_one - (tokens_many - tokens_one) * decode_s) / max(
        1, tokens_many - tokens_one
    )
    per_request = (cpu_one - SERVER_REQUESTS * prefill_s - tokens_one * per_token) / SERVER_REQUESTS
    return max(0.0, per_request), max(0.0, per_token)


PROMPT = "the operators of the cluster keep the weights close to the hosts that serve them"


def _completions(client: Any, count: int, max_tokens: int) -> int:
    """Send ``count`` streamed completions, ``SERVER_CONCURRENCY`` at a time; the completion tokens
    they made."""
    from concurrent.futures import ThreadPoolExecutor

    share = [
        count // SERVER_CONCURRENCY + (i < count % SERVER_CONCURRENCY) for i in range(SERVER_CONCURRENCY)
    ]
    with ThreadPoolExecutor(max_workers=SERVER_CONCURRENCY) as pool:
        return sum(pool.map(lambda n: _completions_in_turn(client, n, max_tokens), share))


def _completions_in_turn(client: Any, count: int, max_tokens: int) -> int:
    """Send ``count`` streamed completions one after another; the completion tokens they made."""
    tokens = 0
    for _ in range(count):
        body = {
            "model": "fit",
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    tokens += int(usage.get("completion_tokens") or 0)
    return tokens


def _prompt_tokens(client: Any) -> int:
    body = {"model": "fit", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    return int(client.post("/v1/completions", json=body).json()["usage"]["prompt_tokens"])


def _cpu_of(pid: int, work: Callable[[], int]) -> tuple[float, int]:
    """(CPU seconds process ``pid`` spent while ``work`` ran, what ``work`` returned)."""
    before = _process_cpu_s(pid)
    result = work()
    return _process_cpu_s(pid) - before, result


def _added(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
    return a[0] + b[0], a[1] + b[1]


def _process_cpu_s(pid: int) -> float:
    """User + system CPU time of every thread of ``pid`` so far (``/proc/PID/stat`` fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _decode_steps_s(
    engine: Any, vocab: int, concurrency: int, now: Callable[[], float], name: str
) -> list[float]:
    """The times of the decode steps of ``concurrency`` sequences run together (prefill excluded)."""
    from frontier_runtime.requests import SamplingParams

    params = SamplingParams(max_tokens=FIT_OUTPUT, temperature=0.0, ignore_eos=True)
    for i in range(concurrency):
        ids = [8 + (i * 131 + j * 17) % (vocab - 8) for j in range(FIT_PROMPT)]  # distinct: no prefix hits
        engine.add_request(f"{name}-{concurrency}-{i}", ids, params)
    engine.step()  # prefills every prompt and samples each sequence's first token
    steps = []
    while engine.has_unfinished():
        start = now()
        engine.step()
        steps.append(now() - start)
    return steps


def measured_cpu(
    threads: int, *, refresh: bool = False, measure_now: Callable[[int], CpuMeasurement] | None = None
) -> tuple[CpuMeasurement, bool]:
    """The cached measurement for ``threads`` on this machine (measured when missing, by
    ``measure_now``, default ``measure``); and whether it came from the cache."""
    path = cache_path(threads)
    if not refresh and path.exists():
        try:
            cached = CpuMeasurement(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError):
            cached = None  # a damaged or older-format cache is measured again, not trusted
        if (
            cached is not None
            and cached.machine == _machine()
            and cached.threads == threads
            and cached.format == FORMAT
        ):
            return cached, True
    result = (measure_now or measure)(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2) + "\n")
    tmp.replace(path)
    return result, False
