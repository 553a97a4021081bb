"""Where the nodes of a replica meet: slots in S3, claimed with conditional writes.

A node group whose replica spans ``N`` nodes (``runtime.nodes_per_replica``) is a row of slots,
replica ``i`` node ``k``, one object each under the history prefix::

    replicas/<node group>/<i>/node-<k>.json   {"instance_id", "address", "at", "key" (node 0 only)}

A booting host takes the first slot in (replica, node) order that is free or whose holder is gone:

- a free slot is created with ``If-None-Match: *``: of two hosts booting at once, S3 lets exactly
  one create it, and the other goes on to the next slot;
- a slot whose holder is no longer a live member of the auto scaling group (terminated, terminating,
  detached: what ``describe-auto-scaling-instances`` says, the call the bootstrap already makes for
  its lifecycle hooks) is overwritten with ``If-Match: <ETag>``: of two hosts taking over the same
  slot, only the first write matches the ETag they both read.

So the first host of a replica is its leader (node 0), and a third host of a 2-node group starts
replica 1. The leader's record carries a fresh random key for the replica's step channel
(``FRONTIER_REPLICA_KEY``); the other nodes read the leader's record for its private address and
that key. A host that boots again (a reboot, a runtime restart) finds its own record and keeps its
slot and, on the leader, its key. A leader slot taken over gets a new key: the old leader's nodes
lose their leader, exit, and rejoin with the new key when their supervisor restarts them.

A host whose replica lost a node moves, at its next claim, to the first free slot before its own
(and frees its own: a record naming no instance): a scale-in that took one node from each of two
replicas leaves two survivors, which form one replica again rather than wait for nodes that never
come. Every move goes to an earlier slot, so the moves end. A record that does not parse counts as
free.

Standard library only: it runs on the host beside the bootstrap, which gives it its S3 calls and the
liveness check (:class:`Slots`).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from frontier_hostside.names import (
    LEADER_ADDRESS_ENV,
    NODE_COMMAND,
    NODE_RANK_ENV,
    REPLICA_INDEX_ENV,
    REPLICA_KEY_ENV,
    REPLICAS_PREFIX,
    RUNTIME_COMMAND_ENV,
    SERVE_COMMAND,
)

# A group's size is at most 1000 hosts (the stack's range): never more replicas than that.
MAX_REPLICAS = 1000
KEY_BYTES = 32


class RendezvousError(Exception):
    """No slot could be claimed, or the replica's leader could not be found in time."""


class Slots(Protocol):
    """What the rendezvous needs from S3 and Auto Scaling (the bootstrap's AWS CLI implements it)."""

    def list_keys(self, prefix: str) -> list[str]: ...

    def read(self, key: str) -> tuple[bytes, str] | None:
        """(body, ETag), or None when there is no such object."""

    def create(self, key: str, body: bytes) -> bool:
        """Write only if no object has the key (If-None-Match: *); False when one has."""

    def replace(self, key: str, body: bytes, etag: str) -> bool:
        """Write only if the object still has ``etag`` (If-Match); False when it changed."""

    def live(self, instance_ids: list[str]) -> set[str]:
        """The ids among ``instance_ids`` that are live members of their auto scaling group."""


@dataclass(frozen=True)
class Holder:
    """One slot's record: who holds it, where it is reached, and (node 0 only) the replica's key."""

    instance_id: str
    address: str
    at: str
    key: str = ""

    def to_bytes(self) -> bytes:
        record = {"instance_id": self.instance_id, "address": self.address, "at": self.at}
        if self.key:
            record["key"] = self.key
        return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Holder:
        try:
            record = json.loads(data)
            return cls(
                str(record["instance_id"]),
                str(record["address"]),
                str(record["at"]),
                str(record.get("key", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RendezvousError(f"{where}: not a slot record ({exc})") from None


@dataclass(frozen=True)
class Claim:
    """This host's place: replica ``replica``, node ``node``, its leader's address and the key."""

    replica: int
    node: int
    leader_address: str
    key: str

    @property
    def command(self) -> str:
        return SERVE_COMMAND if self.node == 0 else NODE_COMMAND

    def env(self) -> list[tuple[str, str]]:
        """What the runtime unit reads (templates/frontier-runtime.service.j2)."""
        return [
            (RUNTIME_COMMAND_ENV, self.command),
            (REPLICA_INDEX_ENV, str(self.replica)),
            (NODE_RANK_ENV, str(self.node)),
            (LEADER_ADDRESS_ENV, self.leader_address),
            (REPLICA_KEY_ENV, self.key),
        ]

    def public(self) -> dict[str, object]:
        """The claim without its key, for logs and answers."""
        return {
            "replica": self.replica,
            "node": self.node,
            "leader": self.leader_address,
            "command": self.command,
        }


def group_prefix(history_prefix: str, node_group: str) -> str:
    return f"{history_prefix}{REPLICAS_PREFIX}{node_group}/"


def slot_key(history_prefix: str, node_group: str, replica: int, node: int) -> str:
    return f"{group_prefix(history_prefix, node_group)}{replica}/node-{node}.json"


def _moment() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Rendezvous:
    slots: Slots
    history_prefix: str
    node_group: str
    nodes: int  # per replica
    instance_id: str
    address: str
    new_key: Callable[[], str] = lambda: secrets.token_hex(KEY_BYTES)

    def claim(self) -> Claim:
        """This host's slot (its own where it holds one already), then its leader."""
        holders = self._holders()
        live = self.slots.live(sorted({h.instance_id for h, _ in holders.values() if h.instance_id}))
        replica, node, mine = self._take_slot(holders, live)
        if node == 0:
            return Claim(replica, node, mine.address, mine.key)
        # Read a moment ago: a live leader's record needs no second read.
        leader = holders.get((replica, 0))
        if leader is not None and leader[0].key and leader[0].instance_id in live:
            return Claim(replica, node, leader[0].address, leader[0].key)
        return Claim(replica, node, *self._wait_for_leader(replica))

    def _key(self, replica: int, node: int) -> str:
        return slot_key(self.history_prefix, self.node_group, replica, node)

    def _holders(self) -> dict[tuple[int, int], tuple[Holder, str]]:
        """Every slot record of the group: (replica, node) -> (holder, ETag)."""
        found: dict[tuple[int, int], tuple[Holder, str]] = {}
        prefix = group_prefix(self.history_prefix, self.node_group)
        for key in self.slots.list_keys(prefix):
            replica, _, name = key[len(prefix) :].partition("/")
            if not replica.isdigit() or not name.startswith("node-") or not name.endswith(".json"):
                continue
            node = name[len("node-") : -len(".json")]
            if not node.isdigit() or int(node) >= self.nodes:
                continue  # a slot of a wider replica than this group's now: nobody takes it
            answer = self.slots.read(key)
            if answer is None:
                continue
            try:
                holder = Holder.from_bytes(answer[0], key)
            except RendezvousError:
                holder = Holder("", "", "")  # no holder anyone can name: a free slot, taken by its ETag
            found[(int(replica), int(node))] = (holder, answer[1])
        return found

    def _mine(self, node: int, key: str = "") -> Holder:
        return Holder(self.instance_id, self.address, _moment(), key or (self.new_key() if node == 0 else ""))

    def _take_slot(
        self, holders: dict[tuple[int, int], tuple[Holder, str]], live: set[str]
    ) -> tuple[int, int, Holder]:
        """(replica, node, this host's record): the slot it holds already, else the one it takes.

        A host whose replica lost a node moves to a free slot earlier in the order where there is
        one, and frees its own: after a scale-in that took one node from each of two replicas, the
        two survivors form one replica again instead of each waiting for a node that never comes.
        """
        live = live | {self.instance_id}
        own = sorted(
            (slot, h, etag) for slot, (h, etag) in holders.items() if h.instance_id == self.instance_id
        )
        if own:
            (replica, node), holder, etag = own[0]
            if self._incomplete(replica, holders, live):
                moved = self._first_free(holders, live, before=(replica, node))
                if moved is not None:
                    self.slots.replace(self._key(replica, node), Holder("", "", _moment()).to_bytes(), etag)
                    return moved
            if holder.address != self.address:  # a stop and start moved it: tell the others
                holder = self._mine(node, holder.key)
                self.slots.replace(self._key(replica, node), holder.to_bytes(), etag)
            return replica, node, holder
        taken = self._first_free(holders, live)
        if taken is None:
            raise RendezvousError(f"no free slot among {MAX_REPLICAS} replicas of {self.node_group}")
        return taken

    def _incomplete(
        self, replica: int, holders: dict[tuple[int, int], tuple[Holder, str]], live: set[str]
    ) -> bool:
        return any(
            (replica, node) not in holders or holders[(replica, node)][0].instance_id not in live
            for node in range(self.nodes)
        )

    def _first_free(
        self,
        holders: dict[tuple[int, int], tuple[Holder, str]],
        live: set[str],
        before: tuple[int, int] = (MAX_REPLICAS, 0),
    ) -> tuple[int, int, Holder] | None:
        """The first slot (before ``before``) that is free or whose holder is gone, now this host's."""
        for replica in range(min(before[0] + 1, MAX_REPLICAS)):
            for node in range(self.nodes):
                if (replica, node) >= before:
                    return None
                held = holders.get((replica, node))
                if held is not None and held[0].instance_id in live:
                    continue
                mine, key = self._mine(node), self._key(replica, node)
                # False: a host booting (or taking over) at the same moment won it; try the next.
                if held is None and self.slots.create(key, mine.to_bytes()):
                    return replica, node, mine
                if held is not None and self.slots.replace(key, mine.to_bytes(), held[1]):
                    return replica, node, mine
        return None

    def _wait_for_leader(
        self, replica: int, timeout_s: float = 600.0, poll_s: float = 5.0
    ) -> tuple[str, str]:
        """(address, key) from the replica's node 0 record, once a live host holds it: a leader slot
        freed by a lost host waits for the host that takes it over (the contract's 10 minutes)."""
        key = self._key(replica, 0)
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.slots.read(key)
            if answer is not None:
                leader = Holder.from_bytes(answer[0], key)
                if leader.key and self.slots.live([leader.instance_id]):
                    return leader.address, leader.key
            if time.monotonic() >= deadline:
                raise RendezvousError(f"{key}: no live leader for replica {replica} after {timeout_s:.0f} s")
            time.sleep(poll_s)


def write_env(claim: Claim, path: Path) -> Path:
    """The claim as ``KEY=VALUE`` lines, readable by root only, replaced in one rename.

    The path is under /run, a tmpfs: the replica's key never reaches a disk.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".replica-")  # created 0600
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"{name}={value}\n" for name, value in claim.env()))
    os.replace(tmp, path)
    return path
