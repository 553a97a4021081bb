"""The EC2 balancer: an ALB target group via boto3 elbv2, deregistered to drain, registered to enable."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from frontier.hosts.balancer import BalancerError
from frontier.hosts.inventory import HostSpec


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
