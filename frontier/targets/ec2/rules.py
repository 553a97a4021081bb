"""What the EC2 target refuses in a stack file: unpinned AMIs, a cache with no disk, plain HTTP.

Every node group (and the gateway's) boots a pinned AMI; a model cache on instance store needs an
instance type that has one; the ALB serves HTTPS with an ACM certificate; the gateway finds a
pool's hosts by their node group's tag, so pools do not share a group; its metering goes to S3.
A group whose replica spans ``N`` nodes (``runtime.nodes_per_replica``) counts whole replicas: its
sizes, its schedule's floors and the rollout's canary and batches are multiples of ``N`` (a partial
replica serves nothing, and a wave that splits a replica would leave its nodes on two releases),
and its hosts come from the auto scaling group (the rendezvous tells a lost host by its group).
"""

from __future__ import annotations

from collections.abc import Iterator

from frontier_settings import FieldProblem

from frontier.config.checks import certificate_problems
from frontier.config.hardware import INSTANCE_STORE, instance_store
from frontier.config.schema import Settings
from frontier.render.boot import replica_nodes


def stack_problems(s: Settings) -> Iterator[FieldProblem]:
    """The node groups', the edge's, the pools' and the gateway's problems on EC2."""
    yield from _node_group_problems(s)
    yield from certificate_problems(s)
    yield from _pool_problems(s)
    yield from _gateway_problems(s)
    yield from _replica_problems(s)
    if s.rollout.traffic_steps and s.gateway is not None:
        # Without a gateway the ALB weighs two target groups (frontier/targets/ec2/balancer.py).
        yield FieldProblem(
            "rollout.traffic_steps",
            list(s.rollout.traffic_steps),
            "behind a gateway the ALB's target group holds the gateway's hosts, not the runtimes, so "
            "its weights cannot split a pool's traffic by release, and the gateway keeps no weights "
            "per runtime; leave it empty on an EC2 stack with a gateway",
        )


def _node_group_problems(s: Settings) -> Iterator[FieldProblem]:
    for i, group in enumerate(s.node_groups):
        where = f"node_groups[{i}]"
        if not group.ami_id:
            yield FieldProblem(
                f"{where}.ami_id",
                group.ami_id,
                "an EC2 stack pins its AMI (ami- followed by 8 or 17 hex digits); "
                f"`fab ami.latest -s {s.stack}` proposes the newest one",
            )
        if group.model_cache == "instance_store" and instance_store(group.instance_type)[0] == 0:
            known = ", ".join(sorted(INSTANCE_STORE))
            yield FieldProblem(
                f"{where}.model_cache",
                group.model_cache,
                f"{group.instance_type} has no NVMe instance store; use 'ebs', or one of: {known}",
            )


def _pool_problems(s: Settings) -> Iterator[FieldProblem]:
    """The gateway finds a pool's hosts by their node group's tag: each pool needs its own group."""
    if len(s.pools) < 2:
        return
    seen_groups: dict[str, str] = {}
    for i, pool in enumerate(s.pools):
        group = pool.group.name
        if group in seen_groups:
            yield FieldProblem(
                f"pools[{i}].node_group",
                group,
                f"already runs model {seen_groups[group]!r}: each pool needs its own node group",
            )
        seen_groups.setdefault(group, pool.name)


def _gateway_problems(s: Settings) -> Iterator[FieldProblem]:
    """The gateway's own CPU node group boots a pinned AMI; its usage records go to S3."""
    gw = s.gateway
    if gw is None:
        return
    if not gw.ami_id:
        yield FieldProblem("gateway.ami_id", "", "the gateway's node group needs a pinned AMI (ami-...)")
    if not gw.metering.uri.startswith("s3://"):
        yield FieldProblem(
            "gateway.metering.uri", gw.metering.uri, "must be s3://bucket/prefix outside the local stack"
        )
    # The ALB fronts the gateway: a non-streamed answer sends no byte until it is done, so past the
    # idle timeout the client gets the ALB's bare 504 while the gateway still waits on the runtime.
    idle_s = s.edge.idle_timeout_s
    if gw.request_timeout_s >= idle_s:
        queues = ", ".join(
            f"pools[{i}].runtime.queue.timeout_ms = {pool.runtime.queue.timeout_ms / 1000:g} s"
            for i, pool in enumerate(s.pools)
        )
        yield FieldProblem(
            "gateway.request_timeout_s",
            gw.request_timeout_s,
            f"must be below edge.idle_timeout_s ({idle_s} s), the ALB's, which fronts the gateway; each hop "
            f"must give up before the one in front of it ({queues}, "
            f"gateway.request_timeout_s = {gw.request_timeout_s:g} s, edge.idle_timeout_s = {idle_s} s)",
        )


def _replica_problems(s: Settings) -> Iterator[FieldProblem]:
    """Whole replicas only, on a group whose replica spans several nodes."""
    for i, group in enumerate(s.node_groups):
        nodes = replica_nodes(s, group)
        if nodes == 1:
            continue
        where, why = (
            f"node_groups[{i}]",
            f"runtime.nodes_per_replica = {nodes}: a partial replica serves nothing",
        )
        for name in ("min_size", "desired_size", "max_size"):
            value = getattr(group, name)
            if value % nodes:
                yield FieldProblem(f"{where}.{name}", value, f"must be a multiple of {nodes} ({why})")
        for w, window in enumerate(group.schedule.windows if group.schedule else ()):
            if window.min_size % nodes:
                yield FieldProblem(
                    f"{where}.schedule.windows[{w}].min_size",
                    window.min_size,
                    f"must be a multiple of {nodes} ({why})",
                )
        if s.inventory.source == "static":
            yield FieldProblem(
                "inventory.source",
                s.inventory.source,
                f"node group {group.name!r} spans {nodes} nodes per replica: its hosts find each other "
                "through its auto scaling group; use source: aws",
            )
        rollout = s.rollout
        for name, value in (("canary_hosts", rollout.canary_hosts), ("batch_size", rollout.batch_size)):
            if value % nodes:
                yield FieldProblem(
                    f"rollout.{name}",
                    value,
                    f"must be a multiple of runtime.nodes_per_replica ({nodes}): a rollout wave takes whole "
                    f"replicas out of service, or a replica's nodes would run two releases",
                )
