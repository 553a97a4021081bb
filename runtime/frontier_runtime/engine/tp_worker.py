"""Ranks >= 1 of a replica (tensor, expert and pipeline parallel): each a spawned process that
loads its shard and mirrors rank 0, on the leader's node or, for a replica over several nodes, on
another (``run_node``; ``nodes`` says how the nodes find and watch each other).

Rank 0 (the engine's own process) runs the scheduler and sampler; each step it sends the step's
inputs to every other rank (``distributed.StepSender``) and all ranks run the same step on their
shards (their heads, experts or layers; ``distributed`` says which rank holds what).
``worker_main`` is the loop of the other ranks. Every parallel size is checked against the model
and the checkpoint's headers before any process starts or any weight is read.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import cast

import torch
from frontier_hostside import names

from frontier_runtime.distributed import Layout, StepSender, free_tcp_port, receive_steps
from frontier_runtime.engine.affinity import pin_if_configured
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.model_runner import ModelRunner, StepInput
from frontier_runtime.engine.nodes import (
    Heartbeat,
    Hello,
    LeaderDoor,
    NodeRole,
    ReplicaError,
    Watchdog,
    checkpoint_digest,
    join_leader,
    replica_settings,
    supervise_ranks,
)
from frontier_runtime.models.llama.config import LlamaConfig
from frontier_runtime.models.llama.loader import Checkpoint, check_experts
from frontier_runtime.models.llama.model import check_parallel

log = logging.getLogger("frontier_runtime.engine")


class TPWorkers:
    """Ranks 1..N-1 of this node as daemon processes, and rank 0's channels to every other rank: pipes to
    this node's, the leader's step connections to other nodes' (none when the replica has one rank)."""

    def __init__(self, config: EngineConfig, role: NodeRole | None = None) -> None:
        self.processes: list[BaseProcess] = []
        self.init_method = ""
        self._steps = StepSender([])
        self._watchdog: Watchdog | None = None
        self._remote: dict[int, Connection] = {}
        layout = check_layout(config)
        ranks = layout.world_size
        if ranks == 1:
            return
        role = role or NodeRole.from_env(config.nodes_per_replica)
        if not role.is_leader:
            raise ReplicaError(
                f"{names.NODE_RANK_ENV}={role.node_rank}: only node 0 serves; run "
                f"`python -m frontier_runtime {names.NODE_COMMAND}` on the other nodes"
            )
        local = role.ranks(ranks)
        check_gpus(config, len(local))
        door = LeaderDoor(role, ranks, hello_of(config, 0)) if role.nodes > 1 else None
        port = role.store_port if door is not None else free_tcp_port()
        self.init_method = f"tcp://127.0.0.1:{port}"
        ctx = torch.multiprocessing.get_context("spawn")
        pipes = []
        try:
            if door is not None:
                # Before this node's ranks start: they would wait in the process group's rendezvous,
                # whose timeout (minutes) is shorter than nodes booting apart may take.
                self._remote = door.gather()  # every other node's ranks, told to join the group
            for rank in local[1:]:
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
        except BaseException:
            if door is not None:
                door.close()
            self.terminate()
            raise
        self._steps = StepSender([*pipes, *self._remote.values()])

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """Call ``on_lost(why)`` once a rank of the replica is lost (see ``nodes.Watchdog``)."""
        if self.processes or self._remote:
            self._watchdog = Watchdog(self._remote, self.processes, on_lost)

    @property
    def lost(self) -> str | None:
        """Why the replica is broken (a rank lost), or None."""
        return self._watchdog.lost if self._watchdog is not None else None

    def send(self, step: StepInput) -> None:
        self._steps.send(step)

    def close(self) -> None:
        """Tell every rank to finish."""
        if self._watchdog is not None:
            self._watchdog.stop()
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
        for conn in self._remote.values():
            conn.close()


def check_gpus(config: EngineConfig, local_ranks: int) -> None:
    """Refuse a CUDA replica whose ranks on this node outnumber its GPUs."""
    if config.device == "cuda" and torch.cuda.device_count() < local_ranks:
        raise ValueError(
            f"parallel: tensor {config.tensor_parallel_size}, expert {config.expert_parallel_size} and "
            f"pipeline {config.pipeline_parallel_size} parallel sizes over {config.nodes_per_replica} node(s) "
            f"need {local_ranks} GPUs on each, found {torch.cuda.device_count()}"
        )


def hello_of(config: EngineConfig, rank: int) -> Hello:
    return Hello(rank, socket.gethostname(), replica_settings(config), checkpoint_digest(config.model_dir))


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
    """Entry point of ranks >= 1 on the leader's node: load the shard, then mirror rank 0's steps."""
    torch.set_num_threads(config.threads_per_rank)
    pin_if_configured(config, rank % config.ranks_per_node)
    mirror_steps(config, rank, init_method, steps)


def remote_rank_main(config: EngineConfig, rank: int, role: NodeRole) -> None:
    """Entry point of a rank on another node: join the leader, load the shard, mirror its steps."""
    configure_rank_logging()
    torch.set_num_threads(config.threads_per_rank)
    pin_if_configured(config, rank % config.ranks_per_node)
    conn, init_method = join_leader(role, hello_of(config, rank))
    beat = Heartbeat(conn)
    try:
        mirror_steps(config, rank, init_method, conn)
    finally:
        beat.stop()


def mirror_steps(config: EngineConfig, rank: int, init_method: str, steps: Connection) -> None:
    """Join the process group, load this rank's shard, run each step rank 0 sends until it stops."""
    runner = ModelRunner(config, rank=rank, init_method=init_method)
    try:
        for step in receive_steps(steps):
            runner.execute(cast(StepInput, step))  # rank 0 sends StepInputs only
    finally:
        runner.shutdown()


def configure_rank_logging() -> None:
    """A spawned rank's log lines go to stderr like its parent's (spawn starts with no handlers)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def run_node(config: EngineConfig, role: NodeRole) -> int:
    """``python -m frontier_runtime node``: this node's ranks of a replica whose leader is elsewhere.

    Returns when any of them ends (the leader went away, or a rank failed), having stopped the others:
    ``EXIT_NODE_LOST``, for the supervisor to restart this node into the next replica it forms."""
    layout = check_layout(config)
    if role.is_leader:
        raise ReplicaError(
            f"{names.NODE_RANK_ENV}=0 is the leader: it runs `python -m frontier_runtime serve`"
        )
    local = role.ranks(layout.world_size)
    check_gpus(config, len(local))
    ctx = torch.multiprocessing.get_context("spawn")
    processes: list[BaseProcess] = []
    for rank in local:
        p = ctx.Process(target=remote_rank_main, args=(config, rank, role), name=f"frontier-rank{rank}")
        p.start()
        processes.append(p)
    log.info(
        "node %d of %d: ranks %d..%d, leader %s:%d",
        role.node_rank,
        role.nodes,
        local[0],
        local[-1],
        role.leader,
        role.port,
        extra={"event": "node_start", "node_rank": role.node_rank, "leader": role.leader},
    )
    return supervise_ranks(processes)
