"""Tensor-parallel ranks >= 1: each a spawned process that loads its shard and mirrors rank 0.

Rank 0 (the engine's own process) runs the scheduler and sampler; each step it sends the step's
inputs to every other rank (``distributed.StepSender``) and all ranks run the same forward on
their shards. ``worker_main`` is the loop of the other ranks.
"""

from __future__ import annotations

import logging
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch

from frontier_runtime.distributed import StepSender, free_tcp_port, receive_steps
from frontier_runtime.engine.affinity import pin_if_configured
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.model_runner import ModelRunner, StepInput
from frontier_runtime.models.llama.config import LlamaConfig, check_tensor_parallel

log = logging.getLogger("frontier_runtime.engine")


class TPWorkers:
    """Ranks 1..tp-1 as daemon processes, and rank 0's pipes to them (none when tp is 1)."""

    def __init__(self, config: EngineConfig) -> None:
        self.processes: list[BaseProcess] = []
        self.init_method = ""
        self._steps = StepSender([])
        tp = config.tensor_parallel_size
        if tp == 1:
            return
        # Refused here, before any process starts, rather than by each rank while loading.
        check_tensor_parallel(LlamaConfig.from_dir(config.model_dir), tp)
        if config.device == "cuda" and torch.cuda.device_count() < tp:
            raise ValueError(
                f"parallel.tensor_parallel_size {tp} needs {tp} GPUs, found {torch.cuda.device_count()}"
            )
        self.init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
        ctx = torch.multiprocessing.get_context("spawn")
        pipes = []
        for rank in range(1, tp):
            receive, send = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=worker_main,
                args=(config, rank, self.init_method, receive),
                daemon=True,
                name=f"frontier-tp-rank{rank}",
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
                log.warning("tensor-parallel worker %s did not exit; terminating it", p.name)
                p.terminate()
                p.join(1.0)

    def terminate(self) -> None:
        for p in self.processes:
            p.terminate()


def worker_main(config: EngineConfig, rank: int, init_method: str, steps: Connection) -> None:
    """Entry point of tensor-parallel ranks >= 1: load the shard, then mirror rank 0's steps."""
    torch.set_num_threads(config.threads_per_rank)
    pin_if_configured(config, rank)
    runner = ModelRunner(config, rank=rank, init_method=init_method)
    try:
        for step in receive_steps(steps):
            runner.execute(step)
    finally:
        runner.shutdown()
