"""The local stack's balancer: HAProxy, its ``haproxy.cfg`` and its runtime API.

HAProxy lists every host slot with active health checks on the readiness path and retries away
from a draining host; a rollout drains and enables slots through its admin socket
(``stats socket ... level admin``).

A rollout by traffic share (``rollout.traffic_steps``, frontier.rollout.weighted) sets the slots'
server weights through the same socket: the balancer every request already passes, changed at
runtime with no reload, each slot's weight and health read back from ``show stat`` for the
rollout's routable-replica check. Such a stack balances by weighted round robin, since leastconn
picks among idle servers in turn whatever their weights.
"""

from __future__ import annotations

import csv
import io
import math
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.balancer import BalancerError
from frontier.hosts.inventory import HostSpec
from frontier.render.templates import render_template

HAPROXY_BACKEND = "runtime"


def spare_pool(settings: Settings) -> PoolSettings:
    """The pool a slot no pool lists is written into haproxy.cfg for (:func:`server_pools`)."""
    first, *_ = settings.pools  # not a pool this code acts for: see server_pools
    return first


def server_pools(settings: Settings) -> dict[str, PoolSettings]:
    """The pool each host slot of the stack serves, by slot name: the pool that lists it in its
    ``hosts`` (a one-model stack's pool lists every slot unless its file names them).

    A spare slot, one no pool lists, is given the stack's first pool: a one-model stack's only
    pool, whose fleet launches it; a stack of several models gives each slot to one pool (``local.up``
    refuses a slot of none, :func:`frontier.targets.local.iam.pool_of_host`), so there the choice only
    writes the spare into haproxy.cfg and never decides how it serves."""
    spare = spare_pool(settings)
    owners = {host.name: pool for pool in reversed(settings.pools) for host in pool.hosts}
    return {host.name: owners.get(host.name, spare) for host in settings.inventory.hosts}


def balancer_backends(settings: Settings) -> list[tuple[str, str, int]]:
    """Every host slot of the stack as an HAProxy server: (name, address, runtime port), each at the
    runtime port of the pool it serves (:func:`server_pools`; a spare slot at its first pool's)."""
    pools = server_pools(settings)
    return [(h.name, h.address, pools[h.name].runtime.port) for h in settings.inventory.hosts]


def render_haproxy(
    settings: Settings,
    backends: Iterable[tuple[str, str, int]],
    *,
    bind_port: int,
    stats_socket: str,
    bind_address: str | None = None,
    stats_port: int | None = None,
) -> str:
    """HAProxy config: active health checks on the readiness path, retries away from draining hosts.

    The limits come from the runtime of the pool each server serves (:func:`server_pools`; a server
    that names no slot of the stack, its first pool's): HAProxy holds at most what every server's
    runtime admits (its concurrency and queue) in all, hands no server more than the least of them
    (one ``default-server`` limit for all), and queues a request as long as the most patient of
    their queues would. A one-model stack's are its pool's."""
    servers = [(str(name), str(address), int(port)) for name, address, port in backends]
    names = [name for name, _, _ in servers]
    if len(set(names)) != len(names):
        raise FrontierError(f"haproxy backends must have distinct names, got {names}")
    pools = server_pools(settings)
    spare = spare_pool(settings)  # a server of no slot: as a spare slot is
    runtimes = [pools.get(name, spare).runtime for name in names] or [spare.runtime]
    admitted = [runtime.max_concurrency + runtime.queue.max_length for runtime in runtimes]
    health = settings.health
    # Streams stay open for the whole generation; the runtime sends SSE keep-alives, so an idle
    # timeout comfortably above the keep-alive interval and the slowest answer is enough.
    stream_timeout_s = max(settings.edge.idle_timeout_s, math.ceil(settings.slo.p99_latency_ms / 1000) * 2)
    return render_template(
        "haproxy.cfg.j2",
        stack=settings.stack,
        servers=servers,
        bind_address=bind_address or (settings.local.bind_address if settings.local else "0.0.0.0"),
        bind_port=int(bind_port),
        # HAProxy reads a bare relative path as host:port; unix@ makes it a socket path relative to
        # the directory HAProxy starts in.
        stats_socket=stats_socket if stats_socket.startswith(("/", "unix@")) else f"unix@{stats_socket}",
        stats_port=stats_port,
        # A weighted rollout splits traffic by server weight; leastconn weighs only servers that are busy.
        balance="roundrobin" if settings.rollout.traffic_steps else "leastconn",
        readiness_path=health.readiness_path,
        inter_ms=health.interval_s * 1000,
        check_timeout_ms=health.timeout_s * 1000,
        fall=health.unhealthy_threshold,
        rise=health.healthy_threshold,
        queue_timeout_ms=max(runtime.queue.timeout_ms for runtime in runtimes),
        stream_timeout_s=stream_timeout_s,
        maxconn=max(1, sum(admitted)),
        server_maxconn=min(admitted),
    )


#: HAProxy's largest server weight.
MAX_WEIGHT = 256


def split_weights(new_hosts: int, old_hosts: int, percent: int) -> tuple[int, int]:
    """Per-host weights (new, old) that give ``new_hosts`` together ``percent`` % of the requests and
    ``old_hosts`` the rest, in HAProxy's 0..256: each side's share divided among its hosts, reduced
    to the smallest integers, scaled down where one would pass 256 (the share then within a percent)."""
    if new_hosts < 1 or old_hosts < 1 or not 0 <= percent <= 100:
        raise FrontierError(
            f"a split needs hosts on both sides and a percent in 0..100, got {new_hosts} new, "
            f"{old_hosts} old, {percent} %"
        )
    new_weight, old_weight = percent * old_hosts, (100 - percent) * new_hosts
    common = math.gcd(new_weight, old_weight)
    new_weight, old_weight = new_weight // common, old_weight // common
    top = max(new_weight, old_weight)
    if top > MAX_WEIGHT:
        # A share above zero stays above zero: rounding must not take a side out of rotation.
        new_weight = max(1 if new_weight else 0, round(new_weight * MAX_WEIGHT / top))
        old_weight = max(1 if old_weight else 0, round(old_weight * MAX_WEIGHT / top))
    return new_weight, old_weight


@dataclass
class HAProxyBalancer:
    """HAProxy's runtime API over its admin socket (``stats socket ... level admin``)."""

    socket_path: str
    backend: str = HAPROXY_BACKEND
    poll_s: float = 0.1

    def command(self, line: str) -> str:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(self.socket_path)
                sock.sendall(line.encode() + b"\n")
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
        except OSError as exc:
            raise BalancerError(
                f"HAProxy admin socket {self.socket_path}: {exc} (is HAProxy running?)"
            ) from exc
        return b"".join(chunks).decode()

    def _set(self, host: HostSpec, state: str) -> None:
        reply = self.command(f"set server {self.backend}/{host.name} state {state}").strip()
        if reply:
            raise BalancerError(
                f"HAProxy refused 'set server {self.backend}/{host.name} state {state}': {reply}"
            )

    def stats(self, host: HostSpec) -> dict[str, str]:
        text = self.command("show stat").lstrip("# ")
        for row in csv.DictReader(io.StringIO(text)):
            if row.get("pxname") == self.backend and row.get("svname") == host.name:
                return row
        raise BalancerError(f"HAProxy has no server {self.backend}/{host.name}")

    def state(self, host: HostSpec) -> str:
        return self.stats(host)["status"]

    def drain(self, host: HostSpec, timeout: float) -> int:
        """Stop new requests, wait for in-flight ones (up to ``timeout``), then maintenance. Returns
        the sessions still open when it gave up waiting (0 when the host drained cleanly)."""
        self._set(host, "drain")
        deadline = time.monotonic() + timeout
        current = int(self.stats(host).get("scur") or 0)
        while current and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            current = int(self.stats(host).get("scur") or 0)
        self._set(host, "maint")
        return current

    def split(self, new: list[HostSpec], old: list[HostSpec], percent: int) -> None:
        """``percent`` % of the backend's traffic to ``new``, the rest to ``old``, by server weight
        (``set weight``); rising weights are set before falling ones, so the hosts that serve now
        keep serving until the others can."""
        new_weight, old_weight = split_weights(len(new), len(old), percent)
        wanted = {h.name: new_weight for h in new} | {h.name: old_weight for h in old}
        self._weigh(wanted)

    def even(self, hosts: list[HostSpec]) -> None:
        """Every host back to the weight haproxy.cfg gave it (``set weight`` ``100%`` of it)."""
        initial = self._initial_weights()
        self._weigh({h.name: initial[h.name] for h in hosts if h.name in initial})

    def routable(self, hosts: list[HostSpec]) -> list[str]:
        """Hosts HAProxy sends requests to: status UP (a failed check or two still counts: "UP 1/2"
        serves until the fall count is reached), weight above zero."""
        names = {h.name for h in hosts}
        return [
            row["svname"]
            for row in self._rows()
            if row["svname"] in names and row["status"].startswith("UP") and int(row["weight"] or 0) > 0
        ]

    def _rows(self) -> list[dict[str, str]]:
        text = self.command("show stat").lstrip("# ")
        return [row for row in csv.DictReader(io.StringIO(text)) if row.get("pxname") == self.backend]

    def _initial_weights(self) -> dict[str, int]:
        """Each server's weight as haproxy.cfg set it (``show servers state``: srv_iweight)."""
        lines = self.command(f"show servers state {self.backend}").splitlines()
        header = next((line.lstrip("# ").split() for line in lines if line.startswith("#")), [])
        rows = [
            dict(zip(header, line.split(), strict=False)) for line in lines[1:] if not line.startswith("#")
        ]
        return {row["srv_name"]: int(row["srv_iweight"]) for row in rows if "srv_iweight" in row}

    def _weigh(self, wanted: dict[str, int]) -> None:
        current = {row["svname"]: int(row["weight"] or 0) for row in self._rows()}
        # Rises first: were a fall set first, a moment could leave every serving host at weight 0.
        for name, weight in sorted(wanted.items(), key=lambda item: item[1] <= current.get(item[0], 0)):
            if current.get(name) == weight:
                continue
            reply = self.command(f"set weight {self.backend}/{name} {weight}").strip()
            if reply:
                raise BalancerError(f"HAProxy refused 'set weight {self.backend}/{name} {weight}': {reply}")

    def enable(self, host: HostSpec, timeout: float) -> None:
        """Back in rotation; returns once HAProxy's own health check has passed (status exactly "UP":
        right after leaving maintenance HAProxy shows "UP 1/2" until a check settles it)."""
        self._set(host, "ready")
        deadline = time.monotonic() + timeout
        status = self.state(host)
        while status != "UP":
            if time.monotonic() > deadline:
                raise BalancerError(
                    f"HAProxy still reports {self.backend}/{host.name} as {status!r} {timeout:.0f}s after enabling it"
                )
            time.sleep(self.poll_s)
            status = self.state(host)
