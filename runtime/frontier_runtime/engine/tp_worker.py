"""Tensor-parallel ranks >= 1: each a spawned process that loads its shard and mirrors rank 0.

Rank 0 (the engine's own process) runs the scheduler and sampler; each step it sends the step's
inputs to every other rank (``distributed.StepSender``) and all ranks run the same forward on
their shards. ``worker_main`` is the loop of the other ranks.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import torch

from frontier_runtime.distributed import receive_steps
from frontier_runtime.engine.model_runner import ModelRunner


def worker_main(rank: int, world_size: int, init_method: str, runner_kwargs: dict, steps: Connection) -> None:
    """Entry point of tensor-parallel ranks >= 1: load the shard, then mirror rank 0's steps."""
    torch.set_num_threads(runner_kwargs.pop("num_threads", torch.get_num_threads()))
    runner = ModelRunner(tp_rank=rank, tp_size=world_size, tp_init_method=init_method, **runner_kwargs)
    try:
        for step in receive_steps(steps):
            runner.execute(step)
    finally:
        runner.tp.destroy()
