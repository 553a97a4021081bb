"""Tensor-parallel primitives over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Megatron-style sharding: the first projection of each block is column-parallel (each rank holds a
slice of the output features: its own attention heads and KV heads, its slice of the MLP), the
second is row-parallel (each rank holds the matching input slice) and its partial sums are
all-reduced over the whole activation tensor, every row of the batch.

Rank 0 hands each step to the other ranks over pipes (``StepSender``, ``receive_steps``) rather
than a collective, so that an idle engine never trips the process group's timeout, and a rank
whose rank 0 died sees EOF and exits. Imports nothing else from the runtime.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
from collections.abc import Iterator
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
        """Sum ``x`` over the ranks, in place."""
        if self.world_size > 1:
            dist.all_reduce(x)
        return x

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest ``value`` any rank holds (every rank must call it)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def shard(self, w: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's contiguous slice of ``w`` along ``dim`` (which must divide evenly)."""
        if self.world_size == 1:
            return w
        size = w.shape[dim]
        if size % self.world_size:
            raise ValueError(f"dimension {dim} of size {size} does not split over {self.world_size} ranks")
        part = size // self.world_size
        return w.narrow(dim, self.rank * part, part)

    def destroy(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()


SINGLE = TPGroup()


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_group(rank: int, world_size: int, init_method: str, device: torch.device) -> TPGroup:
    """Join the process group (every rank must call it); ``SINGLE`` when there is one rank."""
    if world_size == 1:
        return SINGLE
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=120)
        )
    return TPGroup(rank=rank, world_size=world_size)


class StepSender:
    """Rank 0's end of the pipes to the other ranks: every step goes to all of them."""

    def __init__(self, pipes: list[Connection]) -> None:
        self.pipes = pipes

    def send(self, step: object) -> None:
        """Pickle the step once and write the same bytes to every rank (``recv`` unpickles them)."""
        if not self.pipes:
            return
        data = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
        for pipe in self.pipes:
            pipe.send_bytes(data)

    def close(self) -> None:
        """Tell every rank to stop, then close the pipes; a rank already gone is skipped."""
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
                pipe.close()
        self.pipes = []


def receive_steps(pipe: Connection) -> Iterator[object]:
    """The steps rank 0 sends, until it says stop or its end of the pipe closes."""
    while True:
        try:
            step = pipe.recv()
        except EOFError:  # rank 0 is gone
            return
        if step is None:
            return
        yield step
