"""The rate at which the runtime's KV transfer moves a prompt's blocks, prefill process to decode process.

    .venv/bin/python bench/kv_transfer_rate.py [--rounds 5] [--write-table]

The transfer as a decode replica runs it (``frontier_runtime.engine.kv_transfer``): a prefill
process holds a paged KV cache and a lease on its blocks behind its ``TransferServer``; this
process pulls them with ``pull_blocks`` over TCP into a cache of its own, block by block, each
checksummed. Two block layouts: the local stack's tiny model (4 layers, 4 KV heads of 64, float32:
128 KiB a block of 16 tokens) and an 8B-class one (32 layers, 8 KV heads of 128, bfloat16: 2 MiB).
For each, pulls of 1 to 64 blocks; a least-squares line through (bytes, seconds) gives the fixed
cost of one pull (connect, the ask, the lease check) and the rate per byte. The physical bound
beside it: one memcpy of the same bytes in this process.

``--write-table`` writes ``frontier/capacity/kv_transfer_speed.json``, the figure the planner takes
a transfer's cost from on a host whose replicas talk over TCP (``fab plan --explore``). On a shared
machine the rate moves with the other jobs; the line says what the load was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from frontier_runtime.engine.kv_transfer import Lease, LeaseTable, TransferServer, pull_blocks, tokens_digest
from frontier_runtime.requests import KvTransferParams

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "frontier" / "capacity" / "kv_transfer_speed.json"
BLOCK_TOKENS = 16
PULLS = (1, 4, 16, 64)


@dataclass(frozen=True)
class Layout:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def block_bytes(self) -> int:
        return 2 * self.layers * BLOCK_TOKENS * self.kv_heads * self.head_dim * self.dtype.itemsize

    def caches(self, blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (blocks, BLOCK_TOKENS, self.kv_heads, self.head_dim)
        return [
            (torch.randn(shape).to(self.dtype), torch.randn(shape).to(self.dtype)) for _ in range(self.layers)
        ]


LAYOUTS = (
    Layout("tiny (4 layers x 4 KV heads x 64, float32)", 4, 4, 64, torch.float32),
    Layout("8B-class (32 layers x 8 KV heads x 128, bfloat16)", 32, 8, 128, torch.bfloat16),
)


def serve(layout_index: int, blocks: int) -> None:
    """The prefill side, in its own process: a cache, one lease on all its blocks, the listener."""
    layout = LAYOUTS[layout_index]
    leases = LeaseTable()
    # A lease per pull size (the first n blocks). A pulled lease is claimed, never taken: no engine
    # thread runs here, so every round can pull it again.
    for n in PULLS:
        lease = Lease(list(range(n)), tokens_digest(range(n * BLOCK_TOKENS)), time.monotonic() + 3600)
        leases.hold(f"bench-{n}", lease)
    server = TransferServer("bench-engine", leases, layout.caches(blocks), "127.0.0.1", 0)
    print(server.port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.close()


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Seconds per pull and bytes per second from (bytes, seconds): the least-squares line."""
    x = np.array([b for b, _ in points], dtype=float)
    y = np.array([s for _, s in points])
    slope, intercept = np.polyfit(x, y, 1)
    return max(0.0, float(intercept)), 1.0 / float(slope)


def measure(layout_index: int, rounds: int) -> dict[str, object]:
    layout = LAYOUTS[layout_index]
    blocks = max(PULLS)
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(layout_index), "--blocks", str(blocks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        mine = layout.caches(blocks)
        points: list[tuple[int, float]] = []
        best: dict[int, float] = {}
        for _ in range(rounds):
            for n in PULLS:
                ids = list(range(n))
                params = KvTransferParams(
                    do_remote_prefill=True,
                    remote_engine_id="bench-engine",
                    remote_request_id=f"bench-{n}",
                    remote_host="127.0.0.1",
                    remote_port=port,
                    remote_block_ids=tuple(ids),
                )
                digest = tokens_digest(range(n * BLOCK_TOKENS))
                start = time.perf_counter()
                pull_blocks(params, ids, digest, mine, ids, 30.0, [0])
                took = time.perf_counter() - start
                points.append((n * layout.block_bytes, took))
                best[n] = min(best.get(n, took), took)
        per_pull_s, bytes_per_s = fit(points)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
    src = torch.empty(blocks * layout.block_bytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # the first copy faults the pages in
    start = time.perf_counter()
    dst.copy_(src)
    memcpy = src.numel() / (time.perf_counter() - start)
    return {
        "layout": layout.name,
        "block_bytes": layout.block_bytes,
        "per_pull_s": round(per_pull_s, 6),
        "bytes_per_s": round(bytes_per_s),
        "memcpy_bytes_per_s": round(memcpy),
        "fastest_s": {str(n): round(s, 6) for n, s in sorted(best.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-table", action="store_true")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--blocks", type=int, default=max(PULLS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.blocks)
        return 0
    torch.set_num_threads(1)
    rows = [measure(i, args.rounds) for i in range(len(LAYOUTS))]
    load = os.getloadavg()[0]
    print(
        f"\nKV transfer over TCP loopback, prefill process -> decode process, {args.rounds} rounds (load {load:.1f})\n"
    )
    print("| layout | block | per pull ms | transfer GB/s | memcpy GB/s | transfer / memcpy |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        rate, copy = float(r["bytes_per_s"]), float(r["memcpy_bytes_per_s"])  # type: ignore[arg-type]
        print(
            f"| {r['layout']} | {int(r['block_bytes']) // 1024} KiB | {float(r['per_pull_s']) * 1e3:.2f} "  # type: ignore[call-overload]
            f"| {rate / 1e9:.2f} | {copy / 1e9:.2f} | {rate / copy:.2f} |"
        )
    if args.write_table:
        source = (
            f"bench/kv_transfer_rate.py --rounds {args.rounds}, {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()}-core machine shared with other jobs (load {load:.1f}), "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}"
        )
        table = {
            "interconnect": "tcp",
            "measurements": [
                {
                    "layout": r["layout"],
                    "block_bytes": r["block_bytes"],
                    "per_pull_s": r["per_pull_s"],
                    "bytes_per_s": r["bytes_per_s"],
                    "source": source,
                }
                for r in rows
            ],
        }
        TABLE.write_text(json.dumps(table, indent=2) + "\n")
        print(f"\nwrote {TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
