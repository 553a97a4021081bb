"""An EC2 node group as what it is: an auto scaling group, found by its tags, driven through boto3.

A rollout surges where its ``max_size`` leaves room (see :mod:`frontier.rollout.strategy`), protects
the hosts it touches from scale-in and suspends AZRebalance while it runs; ``fab scale`` sets its
desired capacity within min..max.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError
from frontier_hostside.names import HOST_ROOT, NODE_GROUP_TAG, STACK_TAG

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.render.boot import replica_nodes
from frontier.rollout.strategy import GroupSize
from frontier.targets.ec2.discovery import HOST_PYTHON, discover

# While a deploy runs the group must not move hosts between AZs on its own (it would launch and
# terminate hosts under the rollout's feet).
HELD_PROCESSES = ["AZRebalance"]
# Suspended from the group's creation until a release exists (infra/nodes.py): a host with nothing
# to serve fails the load balancer's health check, and replacing it would only launch another.
REPLACE_UNHEALTHY = "ReplaceUnhealthy"
POLL_S = 5.0


class FleetError(FrontierError):
    """The auto scaling group cannot do what was asked (size out of range, hosts that never came)."""


class AsgFleet:
    """One node group's auto scaling group, through boto3."""

    def __init__(
        self, settings: Settings, autoscaling: Any, ec2: Any, group: str, *, poll_s: float = POLL_S
    ) -> None:
        self.settings = settings
        self.autoscaling = autoscaling
        self.ec2 = ec2
        self.group = group
        self.poll_s = poll_s
        self.name = self._find()
        # Instances this fleet protected from scale-in while a rollout holds the group.
        self.protected: set[str] = set()

    def _find(self) -> str:
        """The group tagged with this stack and node group (Pulumi names it; the tags are ours)."""
        wanted = {STACK_TAG: self.settings.stack, NODE_GROUP_TAG: self.group}
        for page in self.autoscaling.get_paginator("describe_auto_scaling_groups").paginate():
            for found in page["AutoScalingGroups"]:
                tags = {t["Key"]: t["Value"] for t in found.get("Tags", [])}
                if all(tags.get(k) == v for k, v in wanted.items()):
                    return found["AutoScalingGroupName"]
        raise FleetError(
            f"stack {self.settings.stack!r}: no auto scaling group tagged {STACK_TAG}={self.settings.stack} "
            f"and {NODE_GROUP_TAG}={self.group} in {self.settings.region} (has `pulumi up` run?)"
        )

    def _describe(self) -> dict[str, Any]:
        return self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.name])[
            "AutoScalingGroups"
        ][0]

    def size(self) -> GroupSize:
        group = self._describe()
        return GroupSize(group["MinSize"], group["DesiredCapacity"], group["MaxSize"])

    def in_service(self) -> set[str]:
        return {i["InstanceId"] for i in self._describe()["Instances"] if i["LifecycleState"] == "InService"}

    def launching(self) -> set[str]:
        """Instances still in their launch (Pending, Pending:Wait, Pending:Proceed)."""
        return {
            i["InstanceId"]
            for i in self._describe()["Instances"]
            if i["LifecycleState"].startswith("Pending")
        }

    def settle(self, timeout_s: float) -> set[str]:
        """Wait until no instance is launching (each passed or abandoned its launch hook), up to
        ``timeout_s``; the ones still launching then."""
        deadline = time.monotonic() + timeout_s
        while (pending := self.launching()) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        return pending

    def replaces_unhealthy(self) -> bool:
        suspended = {p["ProcessName"] for p in self._describe().get("SuspendedProcesses", [])}
        return REPLACE_UNHEALTHY not in suspended

    def replace_unhealthy(self) -> None:
        """From now on the group replaces hosts the load balancer finds unhealthy: there is a release
        for them to serve."""
        self.autoscaling.resume_processes(
            AutoScalingGroupName=self.name, ScalingProcesses=[REPLACE_UNHEALTHY]
        )

    def scale(self, replicas: int) -> GroupSize:
        """Set the desired capacity; a value outside min..max, or one that is not whole replicas where
        a replica spans several nodes, is refused and changes nothing."""
        nodes = replica_nodes(
            self.settings, next(g for g in self.settings.node_groups if g.name == self.group)
        )
        if replicas % nodes:
            raise FleetError(
                f"--replicas {replicas}: a replica of node group {self.group!r} spans {nodes} hosts "
                f"(runtime.nodes_per_replica = {nodes}): give a multiple of {nodes} hosts"
            )
        size = self.size()
        if not size.min_size <= replicas <= size.max_size:
            raise FleetError(
                f"--replicas {replicas}: the group {self.name} of stack {self.settings.stack!r} scales between "
                f"min_size {size.min_size} and max_size {size.max_size} (node_groups[].min_size / max_size; "
                "change the stack file and `pulumi up` to go beyond)"
            )
        self.autoscaling.set_desired_capacity(
            AutoScalingGroupName=self.name, DesiredCapacity=replicas, HonorCooldown=False
        )
        return GroupSize(size.min_size, replicas, size.max_size)

    def grow(self, count: int, timeout_s: float) -> list[HostSpec]:
        """``count`` more hosts, returned once InService (past the launch hook: they serve)."""
        before = {i["InstanceId"] for i in self._describe()["Instances"]}
        size = self.size()
        if size.desired + count > size.max_size:
            raise FleetError(f"{self.name}: {size.desired} + {count} hosts exceed max_size {size.max_size}")
        self.autoscaling.set_desired_capacity(
            AutoScalingGroupName=self.name, DesiredCapacity=size.desired + count, HonorCooldown=False
        )
        deadline = time.monotonic() + timeout_s
        while True:
            new = self.in_service() - before
            if len(new) >= count:
                break
            if time.monotonic() > deadline:
                raise FleetError(
                    f"{self.name}: {len(new)} of {count} new host(s) in service after {timeout_s:.0f}s "
                    "(no capacity, or hosts that abandoned their launch hook: see their boot records)"
                )
            time.sleep(self.poll_s)
        # A surge host is not spare capacity for the scaling policy to take back mid-rollout.
        self._protect(sorted(new), True)
        hosts = discover(self.settings, self.ec2, self.group, root=HOST_ROOT, python=HOST_PYTHON)
        return [h for h in hosts if h.instance_id in new]

    def _protect(self, ids: list[str], protect: bool) -> None:
        if not ids:
            return
        self.autoscaling.set_instance_protection(
            AutoScalingGroupName=self.name, InstanceIds=ids, ProtectedFromScaleIn=protect
        )
        if protect:
            self.protected |= set(ids)
        else:
            self.protected -= set(ids)

    def retire(self, hosts: list[HostSpec]) -> None:
        """Terminate ``hosts``, one fewer desired each; the terminate hook drains them first."""
        for host in hosts:
            self._protect([host.instance_id], False)
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=host.instance_id, ShouldDecrementDesiredCapacity=True
            )

    @contextlib.contextmanager
    def hold(self, hosts: list[HostSpec]) -> Iterator[None]:
        """Protect ``hosts`` from scale-in and suspend AZRebalance; both undone however it ends."""
        ids = [h.instance_id for h in hosts if h.instance_id]
        self.autoscaling.suspend_processes(AutoScalingGroupName=self.name, ScalingProcesses=HELD_PROCESSES)
        self._protect(ids, True)
        try:
            yield
        finally:
            # Everything protected for the rollout (its hosts and any surge hosts) is released.
            present = {x["InstanceId"] for x in self._describe()["Instances"]}
            with contextlib.suppress(ClientError):
                self._protect(sorted(self.protected & present), False)
            self.protected.clear()
            self.autoscaling.resume_processes(AutoScalingGroupName=self.name, ScalingProcesses=HELD_PROCESSES)
