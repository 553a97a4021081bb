"""The CPU of a local host as a roofline device: bandwidth and FLOP/s measured, not looked up.

A few seconds of torch: a large copy (bytes read + written per second) and a square float32
matmul (FLOP/s), each the best of several runs, at the thread count the runtime will use. The
result is cached under ``.frontier/roofline/`` per thread count and machine, so ``fab plan`` pays
for it once.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from frontier.project import state_dir

COPY_BYTES = 256 << 20  # far beyond any last-level cache
MATMUL_N = 1024
REPEATS = 5


@dataclass(frozen=True)
class CpuMeasurement:
    threads: int
    bandwidth: float  # bytes/s, read + written, of a large tensor copy
    flops: float  # float32 FLOP/s of a 1024^3 matmul
    machine: str
    measured_at: str


def _machine() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cores"


def cache_path(threads: int) -> Path:
    return state_dir() / "roofline" / f"cpu-{threads}-threads.json"


def _best_s(fn: Callable[[], object]) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(threads: int) -> CpuMeasurement:
    """Run the micro-benchmark now (about two seconds)."""
    import torch  # the toolkit needs torch only here; importing it lazily keeps `fab` fast

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        copy_s = _best_s(lambda: dst.copy_(src))
        a = torch.randn(MATMUL_N, MATMUL_N)
        b = torch.randn(MATMUL_N, MATMUL_N)
        matmul_s = _best_s(lambda: a @ b)
    finally:
        torch.set_num_threads(previous)
    return CpuMeasurement(
        threads=threads,
        bandwidth=2 * COPY_BYTES / copy_s,
        flops=2 * MATMUL_N**3 / matmul_s,
        machine=_machine(),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def measured_cpu(threads: int, *, refresh: bool = False) -> tuple[CpuMeasurement, bool]:
    """The cached measurement for ``threads`` on this machine (measured when missing); and whether
    it came from the cache."""
    path = cache_path(threads)
    if not refresh and path.exists():
        try:
            cached = CpuMeasurement(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError):
            cached = None  # a damaged cache is measured again, not trusted
        if cached is not None and cached.machine == _machine() and cached.threads == threads:
            return cached, True
    result = measure(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2) + "\n")
    tmp.replace(path)
    return result, False
