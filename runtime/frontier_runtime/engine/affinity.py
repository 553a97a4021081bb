"""Pinning a CPU engine's intra-op threads to cores (``EngineConfig.cpu_bind_threads``).

Unpinned, the kernel moves torch's OpenMP threads between cores, and a thread that resumes on
another core finds its L2 cold: the weight blocks it had prefetched and the activation rows it
holds are in the other core's cache. Pinned, each thread keeps its core (as vLLM's CPU backend
does with ``VLLM_CPU_OMP_THREADS_BIND``): about 5 % on the 100M model's bench run here. Off by
default because pins are per process: several runtimes on one host would share cores pinned, not
balanced by the scheduler, unless each is given its own (``taskset``) before it starts.
"""

from __future__ import annotations

import logging
import os

import torch

from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.ops import cpu_kernel

log = logging.getLogger("frontier_runtime.engine")


def rank_cores(rank: int, threads: int) -> list[int]:
    """The cores rank ``rank`` pins its ``threads`` to: its own slice of the process's allowed CPUs."""
    allowed = sorted(os.sched_getaffinity(0))
    cores = allowed[rank * threads : (rank + 1) * threads]
    if len(cores) < threads:
        raise ValueError(
            f"cpu_bind_threads: rank {rank} needs {threads} cores but this process may run on "
            f"{len(allowed)} ({allowed}); lower cpu_threads or give the process more CPUs"
        )
    return cores


def bind_intra_op_threads(rank: int) -> list[int]:
    """Pin each of torch's intra-op threads of this rank to a core of its own; the cores."""
    threads = torch.get_num_threads()
    cores = rank_cores(rank, threads)
    if not cpu_kernel.load():
        log.warning("cpu_bind_threads: the CPU kernels did not build; threads stay unpinned")
        return []
    torch.ops.frontier.bind_threads(cores)
    log.info("rank %d: %d intra-op threads pinned to cores %s", rank, threads, cores)
    return cores


def pin_if_configured(config: EngineConfig, rank: int) -> None:
    """Pin this rank's intra-op threads when a CPU engine's config asks for it."""
    cpu_kernel.use_native_kernels(config.native_kernels)  # pinning needs the kernels' library
    if config.cpu_bind_threads and config.device == "cpu":
        bind_intra_op_threads(rank)
