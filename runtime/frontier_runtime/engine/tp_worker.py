"""Ranks >= 1 of a replica (tensor, expert and pipeline parallel): each a spawned process that
loads its shard and mirrors rank 0.

Rank 0 (the engine's own process) runs the scheduler and sampler; each step it sends the step's
inputs to every other rank (``distributed.StepSender``) and all ranks run the same step on their
shards (their heads, experts or layers; ``distributed`` says which rank holds what).
``worker_main`` is the loop of the other ranks. Every parallel size is checked against the model
and the checkpoint's headers before any process starts or any weight is read.
"""

from __future__ import annotations

import logging
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch

from frontier_runtime.distributed import Layout, StepSender, free_tcp_port, receive_steps
from frontier_runtime.engine.affinity import pin_if_configured
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.model_runner import ModelRunner, StepInput
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.loader import Checkpoint, check_experts
from frontier_runtime.models.llama.model import check_parallel

log = logging.getLogger("frontier_runtime.engine")


class TPWorkers:
    """Ranks 1..N-1 as daemon processes, and rank 0's pipes to them (none when N is 1)."""

    def __init__(self, config: EngineConfig) -> None:
        self.processes: list[BaseProcess] = []
        self.init_method = ""
        self._steps = StepSender([])
        layout = check_layout(config)
        ranks = layout.world_size
        if ranks == 1:
            return
        if config.device == "cuda" and torch.cuda.device_count() < ranks:
            raise ValueError(
                f"parallel: tensor {layout.tensor_parallel}, expert {layout.expert_parallel} and pipeline "
                f"{layout.pipeline_parallel} parallel sizes need {ranks} GPUs, found {torch.cuda.device_count()}"
            )
        self.init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
        ctx = torch.multiprocessing.get_context("spawn")
        pipes = []
        for rank in range(1, ranks):
            receive, send = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=worker_main,
                args=(config, rank, self.init_method, receive),
                daemon=True,
                name=f"frontier-rank{rank}",
            )
            p.start()
            receive.close()  # the worker holds its own copy
            self.processes.append(p)
            pipes.append(send)
        self._steps = StepSender(pipes)

    def send(self, step: StepInput) -> None:
        self._steps.send(step)

    def close(self) -> None:
        """Tell every rank to finish."""
        self._steps.close()

    def join(self, timeout_s: float) -> None:
        """Wait for the ranks to exit, all within ``timeout_s``; terminate those that do not."""
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("parallel worker %s did not exit; terminating it", p.name)
                p.terminate()
                p.join(1.0)

    def terminate(self) -> None:
        for p in self.processes:
            p.terminate()


def check_layout(config: EngineConfig) -> Layout:
    """The replica's layout, refused here (before any process starts, before any weight is read,
    rather than by each rank while loading) where the model or its checkpoint does not split so."""
    layout = Layout(config.tensor_parallel_size, config.expert_parallel_size, config.pipeline_parallel_size)
    if layout.world_size == 1:
        return layout
    cfg = LlamaConfig.from_dir(config.model_dir)
    check_parallel(cfg, layout)
    if cfg.num_experts:
        check_experts(cfg, Checkpoint(config.model_dir))  # the routers' shapes, from the headers
    return layout


def worker_main(config: EngineConfig, rank: int, init_method: str, steps: Connection) -> None:
    """Entry point of ranks >= 1: load the shard, then mirror rank 0's steps."""
    torch.set_num_threads(config.threads_per_rank)
    pin_if_configured(config, rank)
    runner = ModelRunner(config, rank=rank, init_method=init_method)
    try:
        for step in receive_steps(steps):
            runner.execute(step)
    finally:
        runner.shutdown()
