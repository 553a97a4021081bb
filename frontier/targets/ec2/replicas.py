"""The replicas of a node group whose replica spans several nodes, as its hosts claimed them.

Each host claims its slot (replica, node) in the history bucket at boot
(:mod:`frontier_hostside.rendezvous`). A rollout reads those slots to take the group's hosts in
replica order: each wave of whole replicas (the stack rules make canary_hosts and batch_size
multiples of ``runtime.nodes_per_replica``) then holds every node of its replicas, which the
in-place rollout stops together, starts together and gates on together (a worker's readiness is its
leader's: its port answers as the leader). A host that holds no slot (it is still booting) comes last.
"""

from __future__ import annotations

from typing import Any

from frontier_hostside.rendezvous import Holder, RendezvousError, group_prefix

from frontier.hosts.inventory import HostSpec

Slot = tuple[int, int]  # (replica, node)


def claimed_slots(s3: Any, bucket: str, history_prefix: str, group: str) -> dict[str, Slot]:
    """Instance id -> the (replica, node) its record in S3 gives it."""
    prefix = group_prefix(history_prefix, group)
    slots: dict[str, Slot] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            replica, _, name = item["Key"][len(prefix) :].partition("/")
            node = name.removeprefix("node-").removesuffix(".json")
            if not (replica.isdigit() and node.isdigit()):
                continue
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            try:
                holder = Holder.from_bytes(body, item["Key"])
            except RendezvousError:
                continue  # not a slot record: it orders nothing
            slots[holder.instance_id] = (int(replica), int(node))
    return slots


def in_replica_order(hosts: list[HostSpec], slots: dict[str, Slot]) -> list[HostSpec]:
    """``hosts`` by (replica, node); those that hold no slot last, in their own order."""
    unclaimed = (1 << 30, 0)
    return sorted(hosts, key=lambda h: (slots.get(h.instance_id, unclaimed), h.instance_id, h.address))
