"""Tensor-, expert- and pipeline-parallel primitives over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

Megatron-style sharding: the first projection of each block is column-parallel (each rank holds a
slice of the output features: its own attention heads and KV heads, its slice of the MLP), the
second is row-parallel (each rank holds the matching input slice) and its partial sums are
all-reduced over the whole activation tensor, every row of the batch.

How a replica's ranks split (``Layout``, and each rank's ``Placement`` in it): PP pipeline stages
of G = max(TP, EP) ranks each, global rank = stage * G + local rank. Inside a stage:

- attention and the dense MLPs run in G / TP tensor-parallel groups of TP consecutive ranks; every
  group runs the whole step (one scheduler feeds them all), so with EP > TP attention is replicated;
- the sparse layers use all G ranks: rank r holds the experts [e * E/EP, (e+1) * E/EP) with
  e = r // (G / EP), and when TP > EP each of those experts' intermediate columns split over the
  G / EP ranks that share them. EP = TP is thus expert parallelism over the same ranks as tensor
  parallelism, experts sharded instead of each expert's columns, as the planner models a stage.

This is the planner's stage (``frontier.capacity.roofline.Replica``: G = max(TP, EP) GPUs), except
that the planner gives each of the G / TP attention groups its own share of the tokens, which this
engine (one scheduler, one batch per step) does not do.

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
from torch.distributed import ProcessGroup


@dataclass(frozen=True)
class TPGroup:
    """This process's place in a group of ranks that split tensors and sum partial results."""

    rank: int = 0
    world_size: int = 1
    group: ProcessGroup | None = None  # None: every rank of the replica (the default group)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest ``value`` any rank holds (every rank must call it)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
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
        port: int = s.getsockname()[1]
        return port


def init_group(
    rank: int, world_size: int, init_method: str, device: torch.device, timeout_s: float = 600
) -> TPGroup:
    """Join the process group (every rank must call it); ``SINGLE`` when there is one rank."""
    if world_size == 1:
        return SINGLE
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    return TPGroup(rank=rank, world_size=world_size)


@dataclass(frozen=True)
class Layout:
    """A replica's parallel sizes and the ranks they take (see the module's docstring)."""

    tensor_parallel: int = 1
    expert_parallel: int = 1
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        tp, ep = self.tensor_parallel, self.expert_parallel
        if max(tp, ep) % min(tp, ep):
            raise ValueError(
                f"parallel.expert_parallel_size {ep} and tensor_parallel_size {tp}: the larger must be a "
                "multiple of the smaller (a pipeline stage's ranks hold whole tensor-parallel groups and "
                "whole shards of the experts)"
            )

    @property
    def stage_size(self) -> int:
        """G: the ranks of one pipeline stage."""
        return max(self.tensor_parallel, self.expert_parallel)

    @property
    def world_size(self) -> int:
        return self.pipeline_parallel * self.stage_size

    def stage_layers(self, num_layers: int, stage: int) -> range:
        """The contiguous decoder layers ``stage`` holds; the first ``num_layers % PP`` stages hold one more."""
        pp = self.pipeline_parallel
        if pp > num_layers:
            raise ValueError(
                f"parallel.pipeline_parallel_size {pp} exceeds the model's {num_layers} layers "
                f"(num_hidden_layers): every stage needs at least one layer"
            )
        base, extra = divmod(num_layers, pp)
        start = stage * base + min(stage, extra)
        return range(start, start + base + (stage < extra))

    def groups(self) -> list[tuple[int, ...]]:
        """Every sub-group of ranks that runs collectives of its own, in the order all ranks create them:
        each stage's attention groups, then each stage (where either is smaller than the replica)."""
        g, tp, world = self.stage_size, self.tensor_parallel, self.world_size
        found: list[tuple[int, ...]] = []
        for stage in range(self.pipeline_parallel):
            first = stage * g
            if 1 < tp < world:
                found += [tuple(range(first + a, first + a + tp)) for a in range(0, g, tp)]
            if 1 < g < world and g != tp:  # else the stage is its one attention group
                found.append(tuple(range(first, first + g)))
        return found

    def placement(self, rank: int, groups: dict[tuple[int, ...], ProcessGroup] | None = None) -> Placement:
        """Rank ``rank``'s place; ``groups`` are the process groups of ``groups()`` (none: sharding only)."""
        groups = groups or {}
        g, tp = self.stage_size, self.tensor_parallel
        stage, local = divmod(rank, g)
        first = stage * g
        attention = tuple(range(first + local // tp * tp, first + local // tp * tp + tp))
        members = tuple(range(first, first + g))
        columns = g // self.expert_parallel  # ranks that share one shard of the experts
        return Placement(
            layout=self,
            rank=rank,
            tp=TPGroup(local % tp, tp, groups.get(attention)),
            stage=TPGroup(local, g, groups.get(members)),
            experts=TPGroup(local // columns, self.expert_parallel),
            expert_columns=TPGroup(local % columns, columns),
            world=TPGroup(rank, self.world_size),
        )


@dataclass(frozen=True)
class Placement:
    """One rank's place in its replica: the groups it splits tensors with and sums partial results over.

    ``experts`` and ``expert_columns`` only shard weights (which experts, which of their columns);
    the sparse layers' partial sums are summed over ``stage``."""

    layout: Layout = Layout()
    rank: int = 0
    tp: TPGroup = SINGLE  # attention heads, dense MLP columns
    stage: TPGroup = SINGLE  # every rank of this pipeline stage
    experts: TPGroup = SINGLE  # rank: which E / EP experts this rank holds; world_size: EP
    expert_columns: TPGroup = SINGLE  # which slice of those experts' columns (TP > EP)
    world: TPGroup = SINGLE  # every rank of the replica

    @classmethod
    def of_tensor_parallel(cls, tp: TPGroup) -> Placement:
        """Tensor parallelism alone: the experts split by columns over the same ranks as attention."""
        return Layout(tensor_parallel=tp.world_size).placement(tp.rank)._with_tp(tp)

    def _with_tp(self, tp: TPGroup) -> Placement:
        return Placement(self.layout, self.rank, tp, tp, self.experts, tp, tp)

    @property
    def pipeline_stage(self) -> int:
        return self.rank // self.layout.stage_size

    @property
    def is_first_stage(self) -> bool:
        return self.pipeline_stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pipeline_stage == self.layout.pipeline_parallel - 1

    def destroy(self) -> None:
        """Leave the replica's process group (and with it every sub-group)."""
        self.world.destroy()

    def peer_in_stage(self, stage: int) -> int:
        """The global rank with this rank's local position in pipeline stage ``stage``."""
        return stage * self.layout.stage_size + self.rank % self.layout.stage_size


SINGLE_PLACEMENT = Placement()


def init_placement(
    rank: int, layout: Layout, init_method: str, device: torch.device, timeout_s: float = 600
) -> Placement:
    """Join the replica's process group and its sub-groups (every rank must call it, with the same layout)."""
    if layout.world_size == 1:
        return SINGLE_PLACEMENT
    init_group(rank, layout.world_size, init_method, device, timeout_s)
    # new_group is collective: every rank creates every group, in the same order, member or not.
    groups = {ranks: dist.new_group(list(ranks)) for ranks in layout.groups()}
    return layout.placement(rank, groups)


@dataclass(frozen=True)
class Transfer:
    """A tensor on its way to or from another rank: a sender keeps it alive until ``wait`` returns,
    a receiver finds it filled then."""

    tensor: torch.Tensor
    work: dist.Work

    def wait(self) -> None:
        self.work.wait()


def send_to(tensor: torch.Tensor, rank: int) -> Transfer:
    """Start sending ``tensor`` to global rank ``rank`` (pipeline stages: hidden states forward,
    logits back); the caller goes on computing and waits before the step ends."""
    tensor = tensor.contiguous()
    work = dist.isend(tensor, dst=rank)
    assert work is not None  # None only for a rank outside the default group
    return Transfer(tensor, work)


def start_receive(rank: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Transfer:
    """Post the receive of what ``send_to`` sends from global rank ``rank``; the caller waits later
    (receives from one rank complete in the order they were posted, matching the sends' order)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    work = dist.irecv(out, src=rank)
    assert work is not None  # None only for a rank outside the default group
    return Transfer(out, work)


def receive_from(rank: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Receive the tensor ``send_to`` sends from global rank ``rank`` (its shape and dtype known here)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(out, src=rank)
    return out


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
