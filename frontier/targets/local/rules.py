"""What the local target refuses in a stack file: its section, its ports, its slots.

Everything of the local stack listens on this one machine, so no two of its ports may be the same;
its stand-in for an auto scaling group launches only the host slots the stack lists.
"""

from __future__ import annotations

from collections.abc import Iterator

from frontier_settings import FieldProblem

from frontier.config.schema import Local, Settings


def stack_problems(s: Settings) -> Iterator[FieldProblem]:
    yield from _port_problems(s, s.section(Local))
    yield from _slot_problems(s)
    yield from _disaggregation_problems(s)
    yield from _traffic_split_problems(s)
    yield from _kv_event_problems(s)
    if s.backup.region:
        # moto keeps a replication configuration but copies nothing: a "backup" here would be empty.
        yield FieldProblem(
            "backup.region",
            s.backup.region,
            "the local stack has no second region; fab restore -s local restores from its bucket's versions",
        )


def _disaggregation_problems(s: Settings) -> Iterator[FieldProblem]:
    """Local slots run colocated replicas; the prefill/decode pair runs here in its bench."""
    for i, pool in enumerate(s.pools):
        if pool.disaggregation is not None:
            yield FieldProblem(
                f"pools[{i}].disaggregation",
                "prefill/decode",
                "the local stack runs colocated replicas (bench/disaggregation.py runs a prefill "
                "and a decode runtime side by side here); declare it on an ec2 or kubernetes stack",
            )


def _kv_event_problems(s: Settings) -> Iterator[FieldProblem]:
    """A runtime binds its KV-event ports on every address, and the local slots share this one
    machine: at most one slot publishes on a port."""
    publisher: dict[int, str] = {}  # port -> the slot that binds it
    for i, pool in enumerate(s.pools):
        events = pool.runtime.kv_events
        if not events.enabled:
            continue
        slots = [host.name for host in pool.hosts]
        taken = sorted({publisher[p] for p in (events.port, events.replay_port) if p in publisher})
        if len(slots) > 1 or taken:
            yield FieldProblem(
                f"pools[{i}].runtime.kv_events.enabled",
                True,
                f"the local slots {[*taken, *slots]} share this machine and a runtime binds its event "
                f"ports ({events.port}, {events.replay_port}) on every address: turn kv_events on for "
                "a pool of one host slot, on ports no other pool's events use",
            )
            continue
        publisher.update(dict.fromkeys((events.port, events.replay_port), slots[0] if slots else ""))


def _traffic_split_problems(s: Settings) -> Iterator[FieldProblem]:
    """HAProxy weighs each host; the nodes of one replica cannot take different shares."""
    if not s.rollout.traffic_steps:
        return
    for i, pool in enumerate(s.pools):
        if pool.runtime.nodes_per_replica > 1:
            yield FieldProblem(
                "rollout.traffic_steps",
                list(s.rollout.traffic_steps),
                f"the balancer weighs hosts, and a replica of pools[{i}] spans "
                f"{pool.runtime.nodes_per_replica} nodes (runtime.nodes_per_replica): its nodes "
                "cannot take different shares of the traffic",
            )


def _port_problems(s: Settings, local: Local) -> Iterator[FieldProblem]:
    # Pools may share a runtime port (each runtime listens on its own host's address); none may
    # share one with what listens on the balancer's.
    runtime_ports = {
        pool.runtime.port: f"pools[{i}].runtime.port" for i, pool in reversed(list(enumerate(s.pools)))
    }
    ports = {
        **{field: port for port, field in runtime_ports.items()},
        "local.moto_port": local.moto_port,
        "local.balancer_port": local.balancer_port,
        "local.balancer_stats_port": local.balancer_stats_port,
    }
    taken: dict[int, str] = {}
    for field, port in ports.items():
        if port in taken:
            yield FieldProblem(field, port, f"must differ from {taken[port]} (both listen on this machine)")
        taken.setdefault(port, field)
    if s.gateway is not None and s.gateway.port in taken:
        yield FieldProblem(
            "gateway.port",
            s.gateway.port,
            f"must differ from the runtime, moto and balancer ports ({sorted(taken)})",
        )


def _slot_problems(s: Settings) -> Iterator[FieldProblem]:
    """The local stand-in for an auto scaling group grows only into the slots the stack lists."""
    if s.inventory.source != "static" or s.listed_models:
        return
    slots = len(s.inventory.hosts)
    for i, group in enumerate(s.node_groups):
        if group.max_size > slots:
            yield FieldProblem(
                f"node_groups[{i}].max_size",
                group.max_size,
                f"must be <= the {slots} host slot(s) of inventory.hosts: a local group launches only listed slots",
            )
