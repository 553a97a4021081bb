"""Capacity plan of a stack: GPU memory fit, topology, replicas, nodes and cost, per node group.

Pure functions over typed settings (and the measured baseline when one exists); the ``plan`` task
only formats what these return.

Formulas:
- KV cache bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element; per
  GPU the KV heads are split over tensor-parallel ranks and the layers over pipeline stages.
- replicas = ceil(peak QPS x safety factor / per-replica QPS) + the rolling-upgrade spare, where the
  spare is max(rollout.max_surge, rollout.batch_size) hosts' worth of replicas: the capacity a
  rollout takes out of service (or adds first) at once.
- GPUs per replica = PP x max(TP, EP) (a stage holds whole tensor-parallel groups and whole expert
  ranks); nodes = ceil(replicas / replicas per node), replicas per node = GPUs per node // GPUs per
  replica; a replica larger than a node takes ceil(its GPUs / GPUs per node) whole nodes.
- cost per million output tokens = cost of one replica-hour / (its output tokens/s x 3600) x 10^6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from frontier.capacity.baseline import Baseline
from frontier.config.memory import MemoryFit, memory_fit
from frontier.config.schema import NodeGroup, PoolSettings, Settings


@dataclass(frozen=True)
class Throughput:
    """What one replica serves: measured at the knee of a load test, or assumed in the stack file."""

    replica_qps: float
    output_tokens_per_s: float
    source: Literal["baseline", "assumption", "roofline"]
    baseline: Baseline | None
    detail: str = ""  # for the roofline: the operating point and where its figures come from

    @property
    def explanation(self) -> str:
        if self.source == "roofline":
            return (
                f"MODELLED by the roofline: {self.replica_qps:,.2f} req/s and {self.output_tokens_per_s:,.0f} "
                f"output tokens/s per replica at the largest concurrency meeting every SLO ({self.detail})"
            )
        if self.baseline is not None:
            b = self.baseline
            return (
                f"measured baseline ({b.measured_at}, release {b.release_id}, {b.hosts_measured} host(s)): "
                f"{b.replica_qps:g} req/s and {b.output_tokens_per_s:g} output tokens/s per replica at the knee"
            )
        return (
            f"ASSUMPTION: capacity.assumed_replica_qps = {self.replica_qps:g} req/s per replica "
            f"({self.output_tokens_per_s:,.0f} output tokens/s with capacity.avg_output_tokens); no baseline "
            "measured yet (`fab loadtest` measures one)"
        )


@dataclass(frozen=True)
class Spare:
    """Hosts (and their replicas) kept beyond the peak so a rollout never eats into it."""

    hosts: int
    replicas: int
    reason: str


@dataclass(frozen=True)
class GroupPlan:
    group: NodeGroup
    memory: MemoryFit
    gpus_per_replica: int
    replicas_per_node: int
    idle_gpus_per_node: int
    demand_qps: float
    replicas_for_peak: int
    spare: Spare
    replicas: int
    nodes: int
    cost_per_hour: float
    replica_cost_per_hour: float
    cost_per_million_output_tokens: float
    fleet_cost_per_million_output_tokens: float
    warnings: tuple[str, ...]
    nodes_per_replica: int = 1


@dataclass(frozen=True)
class Plan:
    stack: str
    throughput: Throughput
    groups: tuple[GroupPlan, ...]


def replica_throughput(settings: Settings, baseline: Baseline | None) -> Throughput:
    if baseline is not None:
        return Throughput(baseline.replica_qps, baseline.output_tokens_per_s, "baseline", baseline)
    qps = settings.capacity.assumed_replica_qps
    return Throughput(qps, qps * settings.capacity.avg_output_tokens, "assumption", None)


def replicas_for_peak(peak_qps: float, safety_factor: float, replica_qps: float) -> int:
    """ceil(peak x safety / per-replica), guarded against float noise (4.0000000001 is 4)."""
    return max(1, math.ceil(round(peak_qps * safety_factor / replica_qps, 9)))


def rollout_spare(settings: Settings, replicas_per_node: int, nodes_per_replica: int = 1) -> Spare:
    """Hosts a rollout takes out of service at once, and the replicas on them (a replica over N
    nodes: N of those hosts are one replica)."""
    surge, batch = settings.rollout.max_surge, settings.rollout.batch_size
    if surge >= batch:
        reason = f"rollout.max_surge = {surge} (>= rollout.batch_size = {batch})"
    else:
        reason = f"rollout.batch_size = {batch} (> rollout.max_surge = {surge})"
    hosts = max(surge, batch)
    replicas = hosts * replicas_per_node if nodes_per_replica == 1 else math.ceil(hosts / nodes_per_replica)
    return Spare(hosts=hosts, replicas=replicas, reason=reason)


def plan_group(settings: Settings, pool: PoolSettings, group: NodeGroup, throughput: Throughput) -> GroupPlan:
    """``pool``'s fleet for the stack's peak, were it served on ``group``."""
    rt, capacity = pool.runtime, settings.capacity
    gpus_per_replica = rt.ranks
    nodes_per_replica = math.ceil(gpus_per_replica / group.gpus_per_node)
    if group.name == pool.group.name:  # the stack may spread a replica wider than it must
        nodes_per_replica = max(nodes_per_replica, rt.nodes_per_replica)
    # A replica over several nodes is one unit of a rollout: the spare is counted in replicas then.
    replicas_per_node = group.gpus_per_node // gpus_per_replica if nodes_per_replica == 1 else 1
    demand = capacity.peak_qps * capacity.safety_factor
    for_peak = replicas_for_peak(capacity.peak_qps, capacity.safety_factor, throughput.replica_qps)
    spare = rollout_spare(settings, replicas_per_node, nodes_per_replica)
    replicas = for_peak + spare.replicas
    nodes = math.ceil(replicas / replicas_per_node) * nodes_per_replica
    cost_per_hour = nodes * group.price_per_hour
    # A replica pays for its share of the node, idle GPUs included (all its nodes when it spans several).
    replica_cost = group.price_per_hour * nodes_per_replica / replicas_per_node
    per_million = replica_cost / (throughput.output_tokens_per_s * 3600) * 1e6
    peak_tokens_per_hour = capacity.peak_qps * capacity.avg_output_tokens * 3600
    fleet_per_million = cost_per_hour / peak_tokens_per_hour * 1e6
    return GroupPlan(
        group=group,
        memory=memory_fit(pool, group),
        gpus_per_replica=gpus_per_replica,
        replicas_per_node=replicas_per_node,
        idle_gpus_per_node=(
            group.gpus_per_node - replicas_per_node * gpus_per_replica
            if nodes_per_replica == 1
            else (nodes_per_replica * group.gpus_per_node - gpus_per_replica) // nodes_per_replica
        ),
        demand_qps=demand,
        replicas_for_peak=for_peak,
        spare=spare,
        replicas=replicas,
        nodes=nodes,
        cost_per_hour=cost_per_hour,
        replica_cost_per_hour=replica_cost,
        cost_per_million_output_tokens=per_million,
        fleet_cost_per_million_output_tokens=fleet_per_million,
        warnings=tuple(_warnings(group, nodes)),
        nodes_per_replica=nodes_per_replica,
    )


def _warnings(group: NodeGroup, nodes: int) -> list[str]:
    found = []
    if nodes > group.max_size:
        found.append(
            f"the plan needs {nodes} nodes but node group {group.name!r} has max_size = {group.max_size}: "
            "raise max_size or per-replica throughput"
        )
    elif nodes > group.desired_size:
        found.append(
            f"the plan needs {nodes} nodes but node group {group.name!r} has desired_size = {group.desired_size}"
        )
    return found


def plan_stack(settings: Settings, pool: PoolSettings, baseline: Baseline | None) -> Plan:
    """``pool``'s plan from its measured ``baseline``, else the stated assumption."""
    return plan_with(settings, pool, replica_throughput(settings, baseline))


def plan_with(settings: Settings, pool: PoolSettings, throughput: Throughput) -> Plan:
    """``pool``'s plan for a given per-replica throughput (measured, assumed or modelled)."""
    groups = tuple(plan_group(settings, pool, group, throughput) for group in settings.node_groups)
    return Plan(stack=settings.stack, throughput=throughput, groups=groups)
