"""Tensor parallelism over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Megatron-style sharding: the first projection of each block is column-parallel (each rank holds a
slice of the output features: its own attention heads and KV heads, its slice of the MLP), the
second is row-parallel (each rank holds the matching input slice) and its partial sums are
all-reduced over the whole activation tensor, every row of the batch.

For serving, rank 0 runs the scheduler and sampler; each step it sends the step's inputs to every
other rank over a pipe and all ranks run the same forward on their shards (``worker_main`` is the
loop of ranks >= 1). Steps travel over pipes rather than a collective so that an idle engine never
trips the process group's timeout, and a worker whose rank 0 died sees EOF and exits.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """This process's place in the tensor-parallel group."""

    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(x)
        return x

    def shard(self, w: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous slice of ``w`` along ``dim`` (which must divide evenly)."""
        if self.world_size == 1:
            return w
        size = w.shape[dim]
        if size % self.world_size:
            raise ValueError(f"dimension {dim} of size {size} does not split over {self.world_size} ranks")
        part = size // self.world_size
        return w.narrow(dim, self.rank * part, part)


SINGLE = TPGroup()


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_group(rank: int, world_size: int, init_method: str, device: torch.device) -> TPGroup:
    if world_size == 1:
        return SINGLE
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
        )
    return TPGroup(rank=rank, world_size=world_size)


def worker_main(rank: int, world_size: int, init_method: str, runner_kwargs: dict, steps: Connection) -> None:
    """Entry point of tensor-parallel ranks >= 1: load the shard, then mirror rank 0's steps."""
    from frontier_runtime.engine.model_runner import ModelRunner

    torch.set_num_threads(runner_kwargs.pop("num_threads", torch.get_num_threads()))
    runner = ModelRunner(tp_rank=rank, tp_size=world_size, tp_init_method=init_method, **runner_kwargs)
    try:
        while True:
            try:
                step = steps.recv()
            except EOFError:  # rank 0 is gone
                break
            if step is None:
                break
            runner.execute_local(step)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
