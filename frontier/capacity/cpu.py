"""The CPU of a local host as a roofline device: bandwidth and FLOP/s measured, not looked up.

A few seconds of torch: a large copy (bytes read + written per second) and a square float32
matmul (FLOP/s), each the best of several runs, at the thread count the runtime will use. The
result is cached under ``.frontier/roofline/`` per thread count and machine, so ``fab plan`` pays
for it once.

With one thread the runs are timed by that thread's CPU time, not the wall clock: on a machine
shared with other work the wall clock counts the time the thread waited for a core, which says
nothing about the core. (Memory bandwidth taken by the others still shows.) With more threads the
work runs on torch's pool, whose time only the wall clock sees.
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

COPY_BYTES = 128 << 20  # four times the largest last-level cache here (32 MB)
MATMUL_N = 1024
REPEATS = 5


@dataclass(frozen=True)
class CpuMeasurement:
    threads: int
    bandwidth: float  # bytes/s, read + written, of a large tensor copy
    flops: float  # float32 FLOP/s of a 1024^3 matmul
    machine: str
    measured_at: str
    clock: str  # "thread CPU time" or "wall"


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
    """Run the micro-benchmark now (about two seconds)."""
    import torch  # the toolkit needs torch only here; importing it lazily keeps `fab` fast

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        now = clock(threads)
        copy_s = _best_s(lambda: dst.copy_(src), now)
        a = torch.randn(MATMUL_N, MATMUL_N)
        b = torch.randn(MATMUL_N, MATMUL_N)
        matmul_s = _best_s(lambda: a @ b, now)
    finally:
        torch.set_num_threads(previous)
    return CpuMeasurement(
        threads=threads,
        bandwidth=2 * COPY_BYTES / copy_s,
        flops=2 * MATMUL_N**3 / matmul_s,
        machine=_machine(),
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        clock="thread CPU time" if threads == 1 else "wall",
    )


def measured_cpu(threads: int, *, refresh: bool = False) -> tuple[CpuMeasurement, bool]:
    """The cached measurement for ``threads`` on this machine (measured when missing); and whether
    it came from the cache."""
    path = cache_path(threads)
    if not refresh and path.exists():
        try:
            cached = CpuMeasurement(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError):
            cached = None  # a damaged or older-format cache is measured again, not trusted
        if cached is not None and cached.machine == _machine() and cached.threads == threads:
            return cached, True
    result = measure(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(asdict(result), indent=2) + "\n")
    tmp.replace(path)
    return result, False
