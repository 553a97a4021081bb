"""A replica over several nodes: the leader's door for the other nodes' ranks, and a node's agent.

A replica of W ranks spans ``nodes_per_replica`` = N nodes, W / N ranks each; node k holds the global
ranks k*W/N .. (k+1)*W/N - 1 and gives each of them the GPU of its local index. Node 0, the leader,
runs ``serve``: the API, the scheduler and rank 0 (``TPWorkers`` starts its other local ranks as
today). Every other node runs ``python -m frontier_runtime node`` (``run_node``), which starts its
W / N ranks. In order:

1. each rank of a node connects to the leader's step port (``REPLICA_STEP_PORT``), proving it holds the
   replica's key (an HMAC challenge: ``multiprocessing.connection``'s ``authkey``), and says which rank
   it is and what it runs (``Hello``: the engine settings and a digest of the checkpoint's config);
2. the leader waits until every rank of every node has said so (``LeaderDoor.gather``; up to the join
   timeout, logging who is missing), refuses a rank of another release naming what differs, and
   answers ``join`` with the store port;
3. every rank joins the process group through the leader's store (``REPLICA_STORE_PORT``), loads its
   shard, then runs the steps rank 0 sends down the same connection, as local ranks do over pipes.

Losing a node takes the whole replica out of service: every remote rank sends a heartbeat up its
connection every ``HEARTBEAT_S``; the leader's watchdog (``Watchdog``) reports a rank whose
connection closed (its process died: the kernel closes the socket) or stayed silent for
``SILENT_AFTER_S`` (its node vanished: no FIN ever comes), or a local rank that exited. The engine
then stops, the server answers 503 and exits ``EXIT_NODE_LOST`` so its supervisor restarts it, and
the restarted leader waits for every node again. A node whose leader is gone sees EOF on every
connection; its agent then exits non-zero and its own supervisor restarts it, to rejoin.

The step channel carries pickles, so the key is what stands between the port and code execution:
it must be secret and the ports admitted only between the replica's own nodes (the gloo/NCCL ports
have no authentication at all).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from frontier_hostside import names
from pydantic import BaseModel

log = logging.getLogger("frontier_runtime.engine.nodes")

JOIN_TIMEOUT_S = 600.0  # nodes boot minutes apart: the first may wait for the last
HEARTBEAT_S = 1.0
SILENT_AFTER_S = 10.0  # a rank unheard of this long is lost (its node gone without closing anything)
RETRY_S = 1.0  # a node retries the leader's door this often while it is not open yet

# Settings that may differ between the nodes of one replica (paths, per-host CPU budgets).
PER_NODE_SETTINGS = frozenset({"model_dir", "cpu_threads", "cpu_bind_threads", "cpu_kv_cache_bytes"})


class ReplicaError(RuntimeError):
    """A node cannot join, or a replica lost one of its nodes."""


@dataclass(frozen=True)
class NodeRole:
    """This process's node in its replica, from the environment the target sets (see ``names``)."""

    nodes: int = 1
    node_rank: int = 0
    leader: str = ""  # the leader's address as this node reaches it; on the leader, where to listen
    port: int = names.REPLICA_STEP_PORT
    key: bytes = b""
    join_timeout_s: float = JOIN_TIMEOUT_S

    @classmethod
    def from_env(cls, nodes: int, environ: Mapping[str, str] | None = None) -> NodeRole:
        """The role a target's environment gives; every problem named with its variable and value."""
        env = os.environ if environ is None else environ
        if nodes == 1:
            return cls()
        rank_text = env.get(names.NODE_RANK_ENV, "0")
        if not rank_text.isdigit() or not 0 <= int(rank_text) < nodes:
            raise ReplicaError(
                f"{names.NODE_RANK_ENV}={rank_text!r}: must be a node of this replica, 0..{nodes - 1} "
                f"(runtime.nodes_per_replica is {nodes})"
            )
        key = env.get(names.REPLICA_KEY_ENV, "")
        if len(key) < 16:
            raise ReplicaError(
                f"{names.REPLICA_KEY_ENV} must be set to the replica's secret, at least 16 characters "
                f"(got {len(key)}): it guards the step channel between the nodes"
            )
        leader = env.get(names.LEADER_ADDRESS_ENV, "")
        if int(rank_text) > 0 and not leader:
            raise ReplicaError(f"node {rank_text} needs {names.LEADER_ADDRESS_ENV}: the leader's address")
        return cls(
            nodes=nodes,
            node_rank=int(rank_text),
            leader=leader,
            port=_number(env, names.REPLICA_PORT_ENV, names.REPLICA_STEP_PORT, 1, 65534),
            key=key.encode(),
            join_timeout_s=_number(env, names.REPLICA_JOIN_TIMEOUT_ENV, JOIN_TIMEOUT_S, 1, 86_400),
        )

    @property
    def store_port(self) -> int:
        return self.port + 1

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    def ranks(self, world_size: int, node_rank: int | None = None) -> range:
        """The global ranks node ``node_rank`` (default: this one) holds."""
        per_node = world_size // self.nodes
        k = self.node_rank if node_rank is None else node_rank
        return range(k * per_node, (k + 1) * per_node)

    def node_of(self, rank: int, world_size: int) -> int:
        return rank // (world_size // self.nodes)


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> int:
    text = env.get(name)
    if text is None:
        return int(default)
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not low <= value <= high:
        raise ReplicaError(f"{name}={text!r}: must be an integer within {low:g}..{high:g}")
    return value


@dataclass(frozen=True)
class Hello:
    """What a rank tells the leader first: who it is and what it runs."""

    rank: int
    host: str
    settings: dict[str, object]  # the engine settings, less PER_NODE_SETTINGS
    checkpoint: str  # sha256 of the checkpoint's config.json


def replica_settings(config: BaseModel) -> dict[str, object]:
    """The engine settings every node of a replica must share (``EngineConfig`` as JSON)."""
    dump = config.model_dump(mode="json")
    return {k: v for k, v in sorted(dump.items()) if k not in PER_NODE_SETTINGS}


def checkpoint_digest(model_dir: Path) -> str:
    return hashlib.sha256((Path(model_dir) / "config.json").read_bytes()).hexdigest()


def differences(mine: Hello, theirs: Hello) -> list[str]:
    """What a rank runs differently from the leader, as ``setting: leader X, rank Y``."""
    found = [
        f"{k}: leader {mine.settings.get(k)!r}, rank {theirs.settings.get(k)!r}"
        for k in sorted(set(mine.settings) | set(theirs.settings))
        if mine.settings.get(k) != theirs.settings.get(k)
    ]
    if mine.checkpoint != theirs.checkpoint:
        found.append(
            f"the checkpoint's config.json: leader {mine.checkpoint[:12]}, rank {theirs.checkpoint[:12]}"
        )
    return found


# --- the leader ----------------------------------------------------------------------------------


class LeaderDoor:
    """Node 0's listener for the other nodes' ranks; open from construction until ``gather`` returns."""

    def __init__(self, role: NodeRole, world_size: int, mine: Hello) -> None:
        self.role = role
        self.world_size = world_size
        self.mine = mine
        self.expected = set(range(world_size)) - set(role.ranks(world_size))
        self._listener = Listener((role.leader or "0.0.0.0", role.port), authkey=role.key)
        self._arrived: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="frontier-replica-door", daemon=True)
        self._thread.start()
        log.info(
            "waiting for %d other node(s) of the replica on port %d",
            role.nodes - 1,
            role.port,
            extra={"event": "replica_wait", "nodes": role.nodes, "port": role.port},
        )

    def gather(self) -> dict[int, Connection]:
        """Every other node's ranks, connected and checked, each told to join; by rank."""
        deadline = time.monotonic() + self.role.join_timeout_s
        next_note = time.monotonic() + 30.0
        while not self._done.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            now = time.monotonic()
            if now >= deadline:
                self.close()
                raise ReplicaError(
                    f"replica: {self._missing()} did not join within {self.role.join_timeout_s:g} s; each "
                    f"node must run `python -m frontier_runtime {names.NODE_COMMAND}` with "
                    f"{names.LEADER_ADDRESS_ENV} reaching this host, its {names.NODE_RANK_ENV} and the same "
                    f"{names.REPLICA_KEY_ENV}, and ports {self.role.port} and {self.role.store_port} (and all "
                    "TCP between the replica's nodes) must be open"
                )
            if now >= next_note:
                next_note = now + 30.0
                log.info("replica: still waiting for %s", self._missing(), extra={"event": "replica_wait"})
        self.close()
        with self._lock:
            arrived = dict(sorted(self._arrived.items()))
        for conn in arrived.values():
            conn.send(("join", self.role.store_port))
        log.info("replica: every node joined", extra={"event": "replica_joined", "nodes": self.role.nodes})
        return arrived

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._listener.close()  # the accepting thread's accept() raises and it ends

    def _missing(self) -> str:
        with self._lock:
            missing = sorted(self.expected - set(self._arrived))
        nodes = sorted({self.role.node_of(r, self.world_size) for r in missing})
        return ", ".join(
            f"node {k} (ranks {', '.join(str(r) for r in missing if self.role.node_of(r, self.world_size) == k)})"
            for k in nodes
        )

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn = self._listener.accept()
            except OSError:  # closed by gather() or close()
                return
            except Exception as exc:  # noqa: BLE001 - one bad caller (wrong key, junk) must not shut the door
                log.warning("replica: refused a connection: %s", exc, extra={"event": "replica_refused"})
                continue
            self._admit(conn)

    def _admit(self, conn: Connection) -> None:
        try:
            hello = conn.recv()
        except (EOFError, OSError, Exception) as exc:  # noqa: BLE001 - a caller that left or sent junk
            log.warning("replica: a rank left before saying hello: %s", exc)
            conn.close()
            return
        problem = self._problem(hello)
        if problem:
            log.warning("replica: refused %s", problem, extra={"event": "replica_refused"})
            with contextlib.suppress(OSError):
                conn.send(("refused", problem))
            conn.close()
            return
        with self._lock:
            old = self._arrived.pop(hello.rank, None)
            self._arrived[hello.rank] = conn
            complete = set(self._arrived) == self.expected
        if old is not None:  # that node restarted while the leader waited: the newer one is live
            old.close()
        log.info("replica: rank %d joined from %s", hello.rank, hello.host, extra={"event": "replica_rank"})
        if complete:
            self._done.set()

    def _problem(self, hello: object) -> str:
        if not isinstance(hello, Hello):
            return f"a caller that did not say which rank it is ({type(hello).__name__})"
        if hello.rank not in self.expected:
            return (
                f"rank {hello.rank} from {hello.host}: this replica's other nodes hold ranks "
                f"{min(self.expected)}..{max(self.expected)}"
            )
        diff = differences(self.mine, hello)
        if diff:
            return f"rank {hello.rank} from {hello.host} runs something else than the leader: " + "; ".join(
                diff
            )
        return ""


class Watchdog:
    """The leader's watch over its replica's ranks: calls ``on_lost(why)`` once, when one is lost."""

    def __init__(
        self,
        remote: Mapping[int, Connection],
        local: Iterable[BaseProcess],
        on_lost: Callable[[str], None],
        silent_after_s: float = SILENT_AFTER_S,
    ) -> None:
        self.remote = dict(remote)
        self.local = list(local)
        self.on_lost = on_lost
        self.silent_after_s = silent_after_s
        self.lost: str | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="frontier-replica-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """A shutdown: stop watching before the ranks are told to finish (that is no loss)."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(5.0)
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        heard = {rank: time.monotonic() for rank in self.remote}
        by_conn = {conn: rank for rank, conn in self.remote.items()}
        by_sentinel = {p.sentinel: p for p in self.local}
        while not self._stopping:
            ready = wait([*by_conn, *by_sentinel, self._wake_r], timeout=HEARTBEAT_S)
            if self._stopping:
                return
            for item in ready:
                if item in by_sentinel:
                    p = by_sentinel[item]
                    return self._report(f"local rank process {p.name} exited with code {p.exitcode}")
                if item in by_conn:
                    rank = by_conn[item]
                    try:
                        item.recv_bytes()  # a heartbeat
                    except (EOFError, OSError):
                        return self._report(f"rank {rank}'s connection closed (its process or node is gone)")
                    heard[rank] = time.monotonic()
            now = time.monotonic()
            for rank, at in heard.items():
                if now - at > self.silent_after_s:
                    return self._report(
                        f"rank {rank} sent no heartbeat for {now - at:.0f} s (its node is unreachable)"
                    )

    def _report(self, why: str) -> None:
        self.lost = why
        log.error("replica lost a rank: %s", why, extra={"event": "replica_lost", "reason": why})
        self.on_lost(why)


# --- the other nodes -------------------------------------------------------------------------------


def join_leader(role: NodeRole, hello: Hello) -> tuple[Connection, str]:
    """Connect to the leader (retrying while its door is not open yet), say hello, wait for ``join``;
    returns the connection and the store's init method."""
    deadline = time.monotonic() + role.join_timeout_s
    address = (role.leader, role.port)
    while True:
        try:
            conn = Client(address, authkey=role.key)
            break
        except OSError as exc:  # not listening yet (booting, loading, restarting)
            if time.monotonic() >= deadline:
                raise ReplicaError(
                    f"rank {hello.rank}: the leader {role.leader}:{role.port} did not open within "
                    f"{role.join_timeout_s:g} s ({exc})"
                ) from None
            time.sleep(RETRY_S)
        except Exception as exc:  # AuthenticationError: both ends must hold the same key
            raise ReplicaError(
                f"rank {hello.rank}: the leader {role.leader}:{role.port} refused this node's "
                f"{names.REPLICA_KEY_ENV} ({type(exc).__name__}: {exc}); every node needs the replica's key"
            ) from None
    conn.send(hello)
    try:
        answer = conn.recv()
    except (EOFError, OSError):
        raise ReplicaError(
            f"rank {hello.rank}: the leader closed the connection before the replica formed"
        ) from None
    if answer[0] == "refused":
        raise ReplicaError(f"the leader refused rank {hello.rank}: {answer[1]}")
    return conn, f"tcp://{role.leader}:{answer[1]}"


class Heartbeat:
    """A remote rank's beat up its connection to the leader (see ``Watchdog``)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frontier-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.conn.send_bytes(b"")
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()


def supervise_ranks(processes: list[BaseProcess]) -> int:
    """A node's agent: wait until any rank exits, stop the others, return non-zero.

    A rank ends when its leader is gone or it failed; either way this node no longer belongs to a
    working replica, and a restart (by its supervisor) makes it wait for the leader again."""
    ready = set(wait([p.sentinel for p in processes]))
    # Its sentinel closes as it exits; join() then reaps it (is_alive() may still say True before).
    first = next(p for p in processes if p.sentinel in ready)
    first.join()
    log.warning(
        "rank process %s exited with code %s: stopping this node's ranks",
        first.name,
        first.exitcode,
        extra={"event": "node_stopping", "rank_process": first.name, "exit_code": first.exitcode},
    )
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(10.0)
    return names.EXIT_NODE_LOST
