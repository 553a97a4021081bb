"""Frontier's panel GEMM against oneDNN's packed GEMM, side by side, on a model's linear shapes.

    python bench/panel_gemm_vs_onednn.py [--threads 2] [--rows 1,4,8,16,32,48,64,128,512,2048]

The weights of 12 layers of the ~100M Llama of ``bench/engine_vs_vllm.py`` (qkv 768 -> 1280,
o 768 -> 768, gate/up 768 -> 5632, down 2816 -> 768: 369 MB in float32, more than the caches, so
they stream from memory as in a decode step) are packed both ways. For each row count the two
GEMMs run every layer's four shapes in alternation, ``--pairs`` times; a pair's ratio is panel
GFLOPS over oneDNN GFLOPS, and the row's figure is the median of the pairs, so a load that comes
and goes on the machine touches both sides alike. The last line is
``rows=<r>:<ratio> ...`` for every row count.

With ``--dtype bfloat16`` (a CPU with AVX512-BF16, the ``avx512bf16`` kernels) the weights are bf16
and four GEMMs alternate: the bf16 panel GEMM (``panel``), oneDNN's bf16 GEMM on a packed weight
(``onednn``, what vLLM's CPU engine runs) and on the plain [out, in] weight (``F.linear``, what a
bf16 layer ran before), and the float32 panel GEMM on a widened copy (``widened``, the path of a
CPU without native bf16), activations converted to and from float32 included. The ratio is panel
over oneDNN's packed GEMM.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

SHAPES = [(768, 1280), (768, 768), (768, 5632), (2816, 768)]  # (in, out)
LAYERS = 12


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,4,8,16,32,48,64,128,512,2048")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from frontier_runtime.ops import panel_gemm

    if args.dtype == "bfloat16":
        return bf16(args)

    if not panel_gemm.available():
        print("the panel GEMM is not available here (no g++ or no AVX-512)", file=sys.stderr)
        return 1
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        print("this torch has no oneDNN weight packing", file=sys.stderr)
        return 1

    torch.manual_seed(0)
    weights = [[torch.randn(n, k) * 0.02 for k, n in SHAPES] for _ in range(LAYERS)]
    panels = [[panel_gemm.pack(w) for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in layer] for layer in weights]
    del weights
    flops_per_row = 2 * sum(k * n for k, n in SHAPES) * LAYERS

    def ours(x: torch.Tensor, layer: int, i: int) -> torch.Tensor:
        return panel_gemm.linear(x, panels[layer][i], SHAPES[i][1])

    def theirs(x: torch.Tensor, layer: int, i: int) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, onednn[layer][i], None, "none", [], "")

    def gflops(fn, rows: int) -> float:
        inputs = {k: torch.randn(rows, k) for k, _ in SHAPES}
        start = time.perf_counter()
        for layer in range(LAYERS):
            for i, (k, _) in enumerate(SHAPES):
                fn(inputs[k], layer, i)
        return flops_per_row * rows / (time.perf_counter() - start) / 1e9

    print(f"{'rows':>6} {'panel GFLOPS':>13} {'oneDNN GFLOPS':>14} {'ratio':>6}  ({args.threads} threads)")
    summary = []
    for rows in [int(r) for r in args.rows.split(",")]:
        gflops(ours, rows), gflops(theirs, rows)  # warm: primitives, allocator
        pairs = [(gflops(ours, rows), gflops(theirs, rows)) for _ in range(args.pairs)]
        ratio = statistics.median(a / b for a, b in pairs)
        best_ours, best_theirs = max(a for a, _ in pairs), max(b for _, b in pairs)
        print(f"{rows:>6} {best_ours:>13.0f} {best_theirs:>14.0f} {ratio:>6.2f}", flush=True)
        summary.append(f"rows={rows}:{ratio:.2f}")
    print(" ".join(summary))
    return 0


def bf16(args: argparse.Namespace) -> int:
    """The bf16 panel GEMM against oneDNN's bf16 GEMMs and the widened float32 panels."""
    import torch.nn.functional as F
    from frontier_runtime.ops import panel_gemm

    if not panel_gemm.bf16_available():
        print("the bf16 panel GEMM is not available here (no AVX512-BF16)", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    plain = [[(torch.randn(n, k) * 0.02).bfloat16() for k, n in SHAPES] for _ in range(LAYERS)]
    panels = [[panel_gemm.pack_bf16(w) for w in layer] for layer in plain]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in layer] for layer in plain]
    widened = [[panel_gemm.pack(w.float()) for w in layer] for layer in plain]
    flops_per_row = 2 * sum(k * n for k, n in SHAPES) * LAYERS
    gemms = {
        "panel": lambda x, layer, i: panel_gemm.linear_bf16(x, panels[layer][i], SHAPES[i][1]),
        "onednn": lambda x, layer, i: torch.ops.mkldnn._linear_pointwise(
            x, onednn[layer][i], None, "none", [], ""
        ),
        "F.linear": lambda x, layer, i: F.linear(x, plain[layer][i]),
        "widened": lambda x, layer, i: panel_gemm.linear(x.float(), widened[layer][i], SHAPES[i][1]).to(
            torch.bfloat16
        ),
    }

    def gflops(fn, rows: int) -> float:
        inputs = {k: torch.randn(rows, k).bfloat16() for k, _ in SHAPES}
        start = time.perf_counter()
        for layer in range(LAYERS):
            for i, (k, _) in enumerate(SHAPES):
                fn(inputs[k], layer, i)
        return flops_per_row * rows / (time.perf_counter() - start) / 1e9

    print(
        f"{'rows':>6} " + " ".join(f"{name:>9}" for name in gemms) + f" {'ratio':>6}  (best GFLOPS, "
        f"{args.threads} threads)"
    )
    summary = []
    for rows in [int(r) for r in args.rows.split(",")]:
        for fn in gemms.values():
            gflops(fn, rows)  # warm: primitives, allocator
        runs = [{name: gflops(fn, rows) for name, fn in gemms.items()} for _ in range(args.pairs)]
        ratio = statistics.median(run["panel"] / run["onednn"] for run in runs)
        best = {name: max(run[name] for run in runs) for name in gemms}
        print(f"{rows:>6} " + " ".join(f"{best[n]:>9.0f}" for n in gemms) + f" {ratio:>6.2f}", flush=True)
        summary.append(f"rows={rows}:{ratio:.2f}")
    print(" ".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
