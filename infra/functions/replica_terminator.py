"""Which hosts a multi-node group gives up when it shrinks: whole replicas, never half of one.

An auto scaling group knows hosts, not replicas. Its own termination policies pick hosts by age or
zone, so a scale-in of two hosts from a group of 2-host replicas usually takes one node from each of
two replicas, and an instance refresh one host at a time breaks a replica per host. This module is
the group's custom termination policy, an AWS Lambda function the group asks before it terminates
(``CapacityToTerminate`` and its candidate ``Instances`` in, ``InstanceIDs`` out). It reads the
replicas' slots (:mod:`frontier_hostside.rendezvous`: which instance holds replica ``i`` node
``k``) and answers, in this order:

1. hosts that hold no slot (still booting, or left over): removing them breaks nothing;
2. the members of replicas already missing a node (they serve nothing until the rendezvous
   re-forms them);
3. whole replicas, the highest-numbered first (a booting host takes the lowest free slot, so the
   low replicas stay the dense, long-lived ones).

It never answers a partial replica from step 3: what remains of the capacity then stays
unanswered, and the group asks again later (AWS retries while desired < current), which is when
the whole-replica step policies have brought the request to a multiple of the replica's size.

It runs in Lambda's Python runtime beside the host side's ``rendezvous`` (the slots' layout and
record, one definition), with the runtime's boto3; nothing of the toolkit travels with it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from frontier_hostside.rendezvous import Holder, RendezvousError, group_prefix

# The function's environment, set by the program that creates it (infra/replica_scaling.py).
BUCKET_ENV = "FRONTIER_HISTORY_BUCKET"
PREFIX_ENV = "FRONTIER_HISTORY_PREFIX"
GROUP_ENV = "FRONTIER_NODE_GROUP"
NODES_ENV = "FRONTIER_NODES_PER_REPLICA"


@dataclass(frozen=True)
class Slot:
    replica: int
    node: int
    instance_id: str


def choose(
    candidates: Iterable[str], capacity: int, slots: Iterable[Slot], nodes_per_replica: int
) -> list[str]:
    """The instances to terminate: at most ``capacity`` of ``candidates``, whole replicas only."""
    candidates = list(candidates)
    in_group = set(candidates)
    members: dict[int, set[str]] = defaultdict(set)
    placed: set[str] = set()
    for slot in slots:
        if slot.instance_id in in_group:
            members[slot.replica].add(slot.instance_id)
            placed.add(slot.instance_id)
    chosen = [i for i in candidates if i not in placed][:capacity]
    broken = sorted(r for r, hosts in members.items() if len(hosts) < nodes_per_replica)
    whole = sorted((r for r, hosts in members.items() if len(hosts) >= nodes_per_replica), reverse=True)
    for replica in broken:
        for instance in sorted(members[replica]):
            if len(chosen) < capacity:
                chosen.append(instance)
    for replica in whole:
        if capacity - len(chosen) < len(members[replica]):
            break
        chosen.extend(sorted(members[replica]))
    return chosen


def slots_of(records: Mapping[str, bytes], prefix: str) -> list[Slot]:
    """The slots under ``prefix`` (``<i>/node-<k>.json`` keys); a record that does not parse holds none."""
    slots = []
    for key, body in records.items():
        replica, _, name = key[len(prefix) :].partition("/")
        node = name[len("node-") : -len(".json")] if name.startswith("node-") and name.endswith(".json") else ""
        if not (replica.isdigit() and node.isdigit()):
            continue
        try:
            holder = Holder.from_bytes(body, key)
        except RendezvousError:
            continue
        if holder.instance_id:
            slots.append(Slot(int(replica), int(node), holder.instance_id))
    return slots


def handler(event: Mapping, context: object = None) -> dict[str, list[str]]:
    """Auto scaling's custom termination policy call."""
    import boto3  # Lambda's runtime has it; only the call reads S3

    s3 = boto3.client("s3")
    bucket = os.environ[BUCKET_ENV]
    prefix = group_prefix(os.environ[PREFIX_ENV], os.environ[GROUP_ENV])
    records = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            records[item["Key"]] = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    capacity = sum(int(c["Capacity"]) for c in event.get("CapacityToTerminate", []))
    candidates = [i["InstanceId"] for i in event.get("Instances", [])]
    chosen = choose(candidates, capacity, slots_of(records, prefix), int(os.environ[NODES_ENV]))
    return {"InstanceIDs": chosen}
