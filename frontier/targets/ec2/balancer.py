"""The EC2 balancers: an ALB target group via boto3 elbv2, deregistered to drain, registered to
enable; and, for a rollout by traffic share, two target groups weighed by the API's listener rule."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from frontier.config.outputs import Ec2Outputs
from frontier.hosts.balancer import BalancerError
from frontier.hosts.inventory import HostSpec


@dataclass
class AlbBalancer:
    """An ALB target group via boto3 elbv2: deregister (the group's delay drains it), register."""

    elbv2: Any
    target_group_arn: str
    poll_s: float = 2.0
    # The ALB ends draining on its own after the group's deregistration delay; allow it this margin.
    drain_margin_s: float = 30.0

    def _target(self, host: HostSpec) -> dict[str, Any]:
        # No port: the group's own (the hosts' TLS proxy), the one the auto scaling group registers
        # its instances on. A target named with another port is another target, which the ALB
        # would drain while it kept sending requests to the one the group registered.
        return {"Id": host.instance_id or host.address}

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


#: The weight the main target group carries when the new release takes no traffic, as the API's
#: listener rule declares it (infra/edge.py); a step's weights are percents of it (ALB: 0..999).
FULL_WEIGHT = 100


@dataclass
class AlbWeightedBalancer:
    """Two ALB target groups weighed by the API's listener rule: the rollout by traffic share.

    The main group holds the hosts of the release that serves; the canary group, on the same port
    with the same health check, the hosts of the new one. :meth:`split` moves the new release's hosts
    into the canary group and sets the rule's forward action to ``percent`` for it and the rest for
    the main group; :meth:`even` puts every host back in the main group with all the weight. One
    ``ModifyRule`` sets both weights at once, so no moment leaves both at zero; hosts join a group
    (and pass its health check) before it gains weight, and leave one only after it lost it.

    Targets are named by instance id alone: they serve on the group's port, where the auto scaling
    group registers them too.
    """

    elbv2: Any
    main_group_arn: str
    canary_group_arn: str
    rule_arn: str
    poll_s: float = 2.0
    drain_margin_s: float = 30.0
    #: How long a host joining a group may take to pass its health check.
    join_timeout_s: float = 300.0
    #: Names of the hosts that belong in the canary group (set by :meth:`split`, cleared by
    #: :meth:`even`): a host the rollout drains and enables goes back to the group it belongs in.
    canaries: set[str] = field(default_factory=set)

    @staticmethod
    def _id(host: HostSpec) -> str:
        return host.instance_id or host.address

    def _group(self, host: HostSpec) -> str:
        return self.canary_group_arn if host.name in self.canaries else self.main_group_arn

    def _health(self, group: str, host: HostSpec) -> str | None:
        reply = self.elbv2.describe_target_health(TargetGroupArn=group, Targets=[{"Id": self._id(host)}])
        for desc in reply.get("TargetHealthDescriptions", []):
            if desc["Target"]["Id"] == self._id(host):
                state: str = desc["TargetHealth"]["State"]
                return None if state == "unused" else state
        return None

    def _join(self, group: str, host: HostSpec, timeout: float) -> None:
        """``host`` registered in ``group``; returns once it passes the group's health check."""
        if self._health(group, host) != "healthy":
            self.elbv2.register_targets(TargetGroupArn=group, Targets=[{"Id": self._id(host)}])
        deadline = time.monotonic() + timeout
        while (state := self._health(group, host)) != "healthy":
            if time.monotonic() > deadline:
                raise BalancerError(
                    f"target {self._id(host)} is {state!r}, not healthy, after {timeout:.0f}s"
                )
            time.sleep(self.poll_s)

    def _leave(self, group: str, host: HostSpec, timeout: float) -> bool:
        """``host`` deregistered from ``group``; True once the ALB finished draining it."""
        if self._health(group, host) is None:
            return True
        self.elbv2.deregister_targets(TargetGroupArn=group, Targets=[{"Id": self._id(host)}])
        deadline = time.monotonic() + timeout + self.drain_margin_s
        while self._health(group, host) is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(self.poll_s)
        return True

    def weights(self) -> dict[str, int]:
        """The API rule's forward weights now, by target group ARN."""
        (rule,) = self.elbv2.describe_rules(RuleArns=[self.rule_arn])["Rules"]
        forward = next(a for a in rule["Actions"] if a["Type"] == "forward")
        groups = forward.get("ForwardConfig", {}).get("TargetGroups")
        if not groups:  # a plain forward to one group
            return {forward["TargetGroupArn"]: FULL_WEIGHT}
        return {g["TargetGroupArn"]: int(g.get("Weight", 1)) for g in groups}

    def _weigh(self, canary_weight: int) -> None:
        self.elbv2.modify_rule(
            RuleArn=self.rule_arn,
            Actions=[
                {
                    "Type": "forward",
                    "ForwardConfig": {
                        "TargetGroups": [
                            {"TargetGroupArn": self.main_group_arn, "Weight": FULL_WEIGHT - canary_weight},
                            {"TargetGroupArn": self.canary_group_arn, "Weight": canary_weight},
                        ]
                    },
                }
            ],
        )

    def state(self, host: HostSpec) -> str:
        return self._health(self._group(host), host) or "unregistered"

    def drain(self, host: HostSpec, timeout: float) -> int | None:
        """Deregistered from the group it serves in; None where the ALB still drains it at the deadline."""
        return 0 if self._leave(self._group(host), host, timeout) else None

    def enable(self, host: HostSpec, timeout: float) -> None:
        self._join(self._group(host), host, timeout)

    def split(self, new: list[HostSpec], old: list[HostSpec], percent: int) -> None:
        """``percent`` % of the API's requests to the canary group holding ``new``, the rest to the
        main group holding ``old``: the hosts join their groups, then the rule's weights change, then
        each host leaves the group it no longer belongs in."""
        if not 0 <= percent <= 100:
            raise BalancerError(f"a traffic split takes a percent in 0..100, got {percent}")
        self.canaries = (self.canaries | {h.name for h in new}) - {h.name for h in old}
        for host in new:
            self._join(self.canary_group_arn, host, self.join_timeout_s)
        for host in old:
            self._join(self.main_group_arn, host, self.join_timeout_s)
        self._weigh(percent)
        for host in new:
            self._leave(self.main_group_arn, host, 0)
        for host in old:
            self._leave(self.canary_group_arn, host, 0)

    def even(self, hosts: list[HostSpec]) -> None:
        """Every host back in the main group, all the weight on it, the canary group emptied."""
        for host in hosts:
            self._join(self.main_group_arn, host, self.join_timeout_s)
        self._weigh(0)
        for host in hosts:
            self._leave(self.canary_group_arn, host, 0)
        self.canaries = set()

    def routable(self, hosts: list[HostSpec]) -> list[str]:
        """The hosts passing the health check of a group the rule gives a weight above zero."""
        healthy: set[str] = set()
        for group, weight in self.weights().items():
            if weight <= 0:
                continue
            reply = self.elbv2.describe_target_health(TargetGroupArn=group)
            healthy |= {
                d["Target"]["Id"]
                for d in reply.get("TargetHealthDescriptions", [])
                if d["TargetHealth"]["State"] == "healthy"
            }
        return [h.name for h in hosts if self._id(h) in healthy]


def weighted_balancer(elbv2: Any, outputs: Ec2Outputs[str]) -> AlbWeightedBalancer:
    """The stack's two target groups and its API rule, as ``pulumi up`` exported them for a stack
    with ``rollout.traffic_steps``; a saved file from before the setting was turned on is refused."""
    if not outputs.canary_target_group_arn or not outputs.api_rule_arn:
        raise BalancerError(
            "rollout.traffic_steps needs the stack's canary target group and API rule "
            "(outputs canary_target_group_arn, api_rule_arn): run `pulumi up` with the setting, "
            "then save the stack's outputs again"
        )
    return AlbWeightedBalancer(
        elbv2, outputs.target_group_arn, outputs.canary_target_group_arn, outputs.api_rule_arn
    )
