"""Take a host out of a load balancer and put it back: what a host rollout asks of a balancer.

Draining follows the recipe that loses no request: stop sending new requests to the host, wait
for its in-flight requests to finish (up to the deregistration delay), and only then may the
runtime be stopped. Enabling waits until the balancer's own health check sees the host healthy.
Each host target brings its own: HAProxy's runtime API on the local stack
(:mod:`frontier.targets.local.balancer`), an ALB target group on EC2
(:mod:`frontier.targets.ec2.balancer`). Runtimes that only a gateway routes to have no balancer
entry to take out: the runtime's own drain does it, through the host's agent
(:mod:`frontier.hosts.gateway_fronted`, what EC2 uses behind a gateway).
"""

from __future__ import annotations

from typing import Protocol

from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec


class BalancerError(FrontierError):
    """The balancer refused a command or a host did not reach the wanted state in time."""


class Balancer(Protocol):
    def drain(self, host: HostSpec, timeout: float) -> int | None:
        """Take ``host`` out of rotation; the sessions still open at ``timeout`` (None: unknown)."""
        ...

    def enable(self, host: HostSpec, timeout: float) -> None: ...
    def state(self, host: HostSpec) -> str: ...
