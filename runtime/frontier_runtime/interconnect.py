"""What the replica's ranks measure of their interconnect before they serve: all-reduce bus bandwidth.

A replica over several GPUs or nodes is only as fast as the links between them, and a link that
is misconfigured does not fail: NCCL without EFA (no device in the container, no libfabric
provider) falls back to TCP sockets and the replica serves at a fraction of its speed. So every
rank runs the same all-reduce at start, on the replica's whole process group (NCCL on GPUs, gloo
on CPU hosts, where the tests run it), and the figure is nccl-tests' ``busbw``: the bytes each rank
moves over the slowest rank's time, times ``2 (n - 1) / n``, which is what a ring all-reduce puts
on each link. The ranks agree on the slowest time, so every rank reaches the same verdict: below
``min_bus_gbps`` (a stack setting; 0 reports only) the replica refuses to start, with one line,
and the host is replaced rather than left serving slowly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

GB = 10**9
# nccl-tests' sizes are powers of two; one large message saturates a link without measuring latency.
PROBE_BYTES = 64 * 2**20
WARMUP_ROUNDS = 2
ROUNDS = 5


class InterconnectTooSlow(RuntimeError):
    """The replica's ranks move less than ``min_bus_gbps``: the links are not what the stack asks."""


@dataclass(frozen=True)
class Interconnect:
    backend: str  # nccl or gloo
    ranks: int
    probe_bytes: int
    seconds: float  # one all-reduce, the slowest rank's mean over ROUNDS
    bus_gbps: float  # nccl-tests' busbw

    def __str__(self) -> str:
        return (
            f"all-reduce bus bandwidth {self.bus_gbps:.2f} GB/s over {self.ranks} ranks ({self.backend}, "
            f"{self.probe_bytes / 2**20:.0f} MiB in {self.seconds * 1e3:.1f} ms)"
        )


def bus_gbps(probe_bytes: int, ranks: int, seconds: float) -> float:
    """nccl-tests' all-reduce ``busbw`` in GB/s: algorithm bandwidth times ``2 (n - 1) / n``."""
    return probe_bytes / seconds * 2 * (ranks - 1) / ranks / GB


def measure(device: torch.device, probe_bytes: int = PROBE_BYTES, rounds: int = ROUNDS) -> Interconnect:
    """Time an all-reduce of ``probe_bytes`` on the default group (a collective: every rank calls it)."""
    ranks = dist.get_world_size()
    data = torch.ones(probe_bytes // 4, dtype=torch.float32, device=device)
    for _ in range(WARMUP_ROUNDS):
        dist.all_reduce(data)
    _synchronize(device)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(data)
    _synchronize(device)
    mine = (time.perf_counter() - started) / rounds
    # The slowest rank bounds the collective, and every rank must reach the same verdict.
    slowest = torch.tensor([mine], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    return Interconnect(dist.get_backend(), ranks, probe_bytes, seconds, bus_gbps(probe_bytes, ranks, seconds))


def check(device: torch.device, min_bus_gbps: float, probe_bytes: int = PROBE_BYTES) -> Interconnect:
    """Measure, and refuse (every rank alike) a replica whose links move less than ``min_bus_gbps``."""
    found = measure(device, probe_bytes)
    if found.bus_gbps < min_bus_gbps:
        raise InterconnectTooSlow(
            f"{found}: below runtime.min_bus_gbps = {min_bus_gbps:g} (is the fabric attached and its "
            "provider loaded? on EFA hosts, fi_info -p efa)"
        )
    return found


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
