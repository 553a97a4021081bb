"""Take a host out of a load balancer and put it back: HAProxy's runtime API or an ALB target group.

Draining follows the recipe that loses no request: stop sending new requests to the host, wait
for its in-flight requests to finish (up to the deregistration delay), and only then may the
runtime be stopped. Enabling waits until the balancer's own health check sees the host healthy.
"""

from __future__ import annotations

import csv
import io
import socket
import time
from dataclasses import dataclass
from typing import Any, Protocol

from frontier.errors import FrontierError
from frontier.fleet.inventory import HostSpec

HAPROXY_BACKEND = "runtime"


class BalancerError(FrontierError):
    """The balancer refused a command or a host did not reach the wanted state in time."""


class Balancer(Protocol):
    def drain(self, host: HostSpec, timeout: float) -> int | None:
        """Take ``host`` out of rotation; the sessions still open at ``timeout`` (None: unknown)."""
        ...

    def enable(self, host: HostSpec, timeout: float) -> None: ...
    def state(self, host: HostSpec) -> str: ...


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


@dataclass
class AlbBalancer:
    """An ALB target group via boto3 elbv2: deregister (the group's delay drains it), register."""

    elbv2: Any
    target_group_arn: str
    port: int
    poll_s: float = 2.0
    # The ALB ends draining on its own after the group's deregistration delay; allow it this margin.
    drain_margin_s: float = 30.0

    def _target(self, host: HostSpec) -> dict[str, Any]:
        return {"Id": host.instance_id or host.address, "Port": self.port}

    def _health(self, host: HostSpec) -> str | None:
        reply = self.elbv2.describe_target_health(
            TargetGroupArn=self.target_group_arn, Targets=[self._target(host)]
        )
        for desc in reply.get("TargetHealthDescriptions", []):
            if desc["Target"]["Id"] == self._target(host)["Id"]:
                return desc["TargetHealth"]["State"]
        return None

    def state(self, host: HostSpec) -> str:
        return self._health(host) or "unregistered"

    def drain(self, host: HostSpec, timeout: float) -> int | None:
        """Deregister and wait for the ALB to finish draining. The ALB does not tell how many
        connections are still open, so a target still draining at the deadline reports ``None``
        (unknown); a finished drain reports 0."""
        self.elbv2.deregister_targets(TargetGroupArn=self.target_group_arn, Targets=[self._target(host)])
        deadline = time.monotonic() + timeout + self.drain_margin_s
        while self._health(host) in ("draining", "healthy", "initial", "unhealthy"):
            if time.monotonic() > deadline:
                return None
            time.sleep(self.poll_s)
        return 0

    def enable(self, host: HostSpec, timeout: float) -> None:
        self.elbv2.register_targets(TargetGroupArn=self.target_group_arn, Targets=[self._target(host)])
        deadline = time.monotonic() + timeout
        while (state := self._health(host)) != "healthy":
            if time.monotonic() > deadline:
                raise BalancerError(
                    f"target {self._target(host)['Id']} is {state!r}, not healthy, after {timeout:.0f}s"
                )
            time.sleep(self.poll_s)
