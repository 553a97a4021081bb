"""The balancer of runtime hosts that only a gateway routes to: their runtimes' own drain, read
through each host's agent.

Behind a gateway the load balancer fronts the gateway hosts, never the runtimes (on EC2 the ALB's
target group holds the gateway's group alone, infra/ec2_program.py), so there is no target to take
out and putting a runtime there would send clients past the gateway's keys, quotas and metering.
The gateway finds each pool's runtimes itself (on EC2 by their node group's tags) and probes each
replica's readiness every ``gateway.probe.interval_s``. What takes a runtime out of its rotation is
therefore the runtime's own readiness, and this balancer drives nothing else.

Drain: the host's agent stops the runtime (the command the rollout's stop phase gives next, which
then finds nothing running). SIGTERM starts the runtime's drain: its readiness fails that instant,
so the gateway's next probe takes the replica out; a request the gateway sends it meanwhile is
answered 503 (or refused once the process is gone) before any byte reached the client, and the
gateway sends it to another replica; the requests in flight finish, then the runtime exits. No
request is lost unless one outlives the runtime's ``drain_timeout_s``, which the runtime then ends.
What the drain says it knows: the runtime exits before its drain timeout only once its last request
has finished, so a stop that returned sooner than both that timeout and the drain's own ``timeout``
left 0 sessions open; one that took longer reports None (unknown), since the runtime then ended
what was left and says how many only in its log.

Why not the gateway's own view: its admin app (``/admin/replicas/interrupt``, the readiness detail)
listens on each gateway host's loopback (``gateway.admin_host``), which the deploy role's ``fab``
does not reach, and its readiness detail counts a pool's ready replicas without naming them.

Enable: the runtime is ready (through the agent, as the rollout's readiness phase saw it), then one
probe round of the gateway (``probe.interval_s + probe.timeout_s``) passes, within which the
gateway's prober finds the replica ready and routes to it. A host new to the gateway (a surge host)
is found by its discovery on its own interval; until then the pool's other replicas serve.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from frontier.hosts.balancer import BalancerError
from frontier.hosts.inventory import HostSpec
from frontier.hosts.session import HostFacts


class RuntimeAgent(Protocol):
    """What this balancer asks of a host: the agent's ``stop`` and ``status``, over one connection."""

    def stop(self) -> object: ...
    def status(self) -> HostFacts: ...
    def close(self) -> None: ...


@dataclass
class GatewayFronted:
    """Runtime hosts behind a gateway: drained by the runtime's own drain, enabled once ready."""

    #: A session on a host (its agent over a connection of its own), closed after each use.
    session: Callable[[HostSpec], RuntimeAgent]
    #: The runtime's ``drain_timeout_s``: it ends what is still in flight after this long.
    runtime_drain_s: float
    #: One probe round of the gateway: ``gateway.probe.interval_s + gateway.probe.timeout_s``.
    probe_round_s: float
    poll_s: float = 1.0

    def drain(self, host: HostSpec, timeout: float) -> int | None:
        """Stop the runtime through its agent, which drains it; 0 when it exited with nothing in
        flight within ``timeout``, None when that is unknown (see the module's docstring)."""
        started = time.monotonic()
        agent = self.session(host)
        try:
            agent.stop()
        finally:
            agent.close()
        took = time.monotonic() - started
        return 0 if took < min(timeout, self.runtime_drain_s) else None

    def enable(self, host: HostSpec, timeout: float) -> None:
        """Wait until the runtime answers ready, then one probe round of the gateway."""
        deadline = time.monotonic() + timeout
        agent = self.session(host)
        try:
            while not (facts := agent.status()).ready:
                if time.monotonic() > deadline:
                    state = "not ready" if facts.running else "not running"
                    raise BalancerError(
                        f"{host.name}: the runtime is {state} {timeout:.0f}s after enabling it, "
                        "so the gateway's prober would not route to it"
                    )
                time.sleep(self.poll_s)
        finally:
            agent.close()
        time.sleep(self.probe_round_s)

    def state(self, host: HostSpec) -> str:
        """``ready`` (the gateway's prober routes to it), ``not ready`` (running: starting or
        draining) or ``stopped``, as the host's agent reads the runtime's readiness."""
        agent = self.session(host)
        try:
            facts = agent.status()
        finally:
            agent.close()
        if facts.ready:
            return "ready"
        return "not ready" if facts.running else "stopped"
