"""Where the stack's GPU hosts can run: the availability zones that offer each instance type, and
the account's vCPU quota for its family — both read before anything is created.

AWS reports neither up front. An auto scaling group whose subnets sit in a zone that does not offer
its type keeps failing launches there; a cluster placement group (EFA) pinned to such a zone never
launches at all; and a new account's quotas for P and G instances start at 0 vCPUs, so the first
launch fails with ``VcpuLimitExceeded`` after the network, the balancer and the IAM are built. The
program asks first (``DescribeInstanceTypeOfferings``, Service Quotas' ``GetServiceQuota``), places
each group in the zones that offer its type, and refuses the stack naming the zone or the quota.

Spot hosts count against quotas of their own ("All G and VT Spot Instance Requests", "All P Spot
Instance Requests"), also 0 in a new account and granted apart from the on-demand ones: a group
that buys spot is checked against both, each for its share of the group at ``max_size`` (the
on-demand base and percentage above it on the on-demand quota, the rest on the spot quota).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import pulumi_aws as aws

from frontier.capacity.gpus import INSTANCES
from frontier.config.purchase import SpotCapacity
from frontier.config.schema import Kubernetes, NodeGroup, Settings


@dataclass(frozen=True)
class Quota:
    code: str  # Service Quotas' code, what an increase request names
    name: str  # as the Service Quotas console lists it


# Running On-Demand instances are limited in vCPUs per instance family; GPU families have their
# own quotas, which start at 0 in a new account.
ON_DEMAND_VCPU_QUOTAS = {
    "p": Quota("L-417A185B", "Running On-Demand P instances"),
    "g": Quota("L-DB2E81BA", "Running On-Demand G and VT instances"),
}
# Spot instances, running or requested, in vCPUs per family: quotas apart from the on-demand ones.
SPOT_VCPU_QUOTAS = {
    "p": Quota("L-7212CCBC", "All P Spot Instance Requests"),
    "g": Quota("L-3819A6DF", "All G and VT Spot Instance Requests"),
}


def quota_of(instance_type: str, *, spot: bool = False) -> Quota | None:
    """The vCPU quota an instance type counts against, on-demand or ``spot`` (None: not a GPU family's)."""
    quotas = SPOT_VCPU_QUOTAS if spot else ON_DEMAND_VCPU_QUOTAS
    family = instance_type.split(".", 1)[0]
    if family.startswith("vt"):
        return quotas["g"]
    return quotas.get(family[:1]) if family[:1] in "pg" else None


def market_shares(group: NodeGroup) -> tuple[int, int]:
    """How many of ``group``'s hosts at ``max_size`` are on-demand and how many spot.

    Auto Scaling turns the percentage above the base into hosts rounding up, in favour of
    on-demand; a group that does not buy spot is on-demand throughout (a Capacity Block's hosts
    included, as the on-demand quota has always counted them here).
    """
    spot = group.capacity
    if not isinstance(spot, SpotCapacity):
        return group.max_size, 0
    base = min(spot.on_demand_base, group.max_size)
    above = group.max_size - base
    on_demand_above = math.ceil(above * spot.on_demand_above_base_percent / 100)
    return base + on_demand_above, above - on_demand_above


@dataclass(frozen=True)
class QuotaDemand:
    """What the node groups need of one quota at ``max_size``, and which hosts ask for it."""

    quota: Quota
    vcpus: int
    hosts: tuple[str, ...]  # "h100: 3 spot of 4 x p5.48xlarge", one per group


def quota_demands(settings: Settings) -> list[QuotaDemand]:
    """Every GPU quota the node groups count against, with the vCPUs they need of it at max_size."""
    vcpus: dict[Quota, int] = defaultdict(int)
    hosts: dict[Quota, list[str]] = defaultdict(list)
    for group in gpu_groups(settings):
        instance = INSTANCES.get(group.instance_type)
        if instance is None:
            continue  # the stack check names an unknown type
        on_demand, spot = market_shares(group)
        for count, is_spot in ((on_demand, False), (spot, True)):
            quota = quota_of(group.instance_type, spot=is_spot)
            if quota is None or count == 0:
                continue  # other families have no GPU quota
            vcpus[quota] += count * _largest_vcpus(group)
            market = "spot" if is_spot else "on-demand"
            mixed = isinstance(group.capacity, SpotCapacity)
            what = f"{count} {market} of {group.max_size}" if mixed else f"{count}"
            hosts[quota].append(f"{group.name}: {what} x {group.instance_type}")
    return [QuotaDemand(quota, vcpus[quota], tuple(hosts[quota])) for quota in vcpus]


def _largest_vcpus(group: NodeGroup) -> int:
    """vCPUs of a host of ``group``: a spot group's largest type, as the market may give it any of its
    types (they carry the same GPUs, not always the same vCPUs)."""
    types = (
        group.instance_type,
        *(group.capacity.instance_types if isinstance(group.capacity, SpotCapacity) else ()),
    )
    return max(INSTANCES[t].vcpus for t in types if t in INSTANCES)


@dataclass(frozen=True)
class GpuPlacement:
    """What the region offers the stack's GPU instance types, and the account's quotas for them."""

    offered: Mapping[str, tuple[str, ...]]  # instance type -> availability zones offering it
    vcpu_quotas: Mapping[str, float]  # quota code -> vCPUs the account may run

    def zones_for(self, group: NodeGroup, zones: Iterable[str], types: Iterable[str] = ()) -> tuple[str, ...]:
        """Of the stack's ``zones`` (in their order), those that offer every instance type the group
        launches: its own, or ``types`` where it launches several (an EKS node pool's list)."""
        if group.accelerator != "gpu":
            return tuple(zones)
        wanted = tuple(types) or (group.instance_type,)
        return tuple(zone for zone in zones if all(zone in self.offered.get(t, ()) for t in wanted))


def gpu_groups(settings: Settings) -> list[NodeGroup]:
    return [group for group in settings.node_groups if group.accelerator == "gpu"]


def look_up_placement(settings: Settings, types: Iterable[str] = ()) -> GpuPlacement:
    """Offerings per zone of every GPU group's instance type (and of ``types``, the other types its
    groups may launch), and the quotas those types count against."""
    types = sorted({group.instance_type for group in gpu_groups(settings)} | set(types))
    offered: dict[str, list[str]] = defaultdict(list)
    if types:
        offerings = aws.ec2.get_instance_type_offerings(
            location_type="availability-zone",
            filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=types)],
        )
        for instance_type, zone in zip(offerings.instance_types, offerings.locations, strict=True):
            offered[instance_type].append(zone)
    codes = sorted(
        {quota.code for t in types if (quota := quota_of(t)) is not None}
        | {demand.quota.code for demand in quota_demands(settings)}
    )
    quotas = {
        code: float(aws.servicequotas.get_service_quota(service_code="ec2", quota_code=code).value)
        for code in codes
    }
    return GpuPlacement(offered={t: tuple(sorted(zones)) for t, zones in offered.items()}, vcpu_quotas=quotas)


def placement_problems(settings: Settings, zones: tuple[str, ...], placement: GpuPlacement) -> Iterator[str]:
    """A GPU group whose type no zone of the stack offers, and a quota below what the groups need."""
    for index, group in enumerate(settings.node_groups):
        if placement.zones_for(group, zones):
            continue
        elsewhere = placement.offered.get(group.instance_type, ())
        yield (
            f"node_groups[{index}].instance_type = {group.instance_type!r}: not offered in the stack's "
            f"availability zones ({', '.join(zones)}); "
            + (
                f"offered in {', '.join(elsewhere)}: raise network.availability_zones or pick another type"
                if elsewhere
                else "offered in no zone of this region"
            )
        )
    yield from _quota_problems(settings, placement)


def _quota_problems(settings: Settings, placement: GpuPlacement) -> Iterator[str]:
    # Every group may grow to max_size: a quota that stops it there fails scale-out at peak.
    for demand in quota_demands(settings):
        quota, vcpus = demand.quota, demand.vcpus
        have = placement.vcpu_quotas.get(quota.code, 0.0)
        if vcpus > have:
            yield (
                f"EC2 quota {quota.code} ({quota.name}) in {settings.region} is {have:g} vCPUs; the node groups "
                f"need {vcpus} at max_size ({'; '.join(demand.hosts)}): request an increase "
                f"(aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
                f"{quota.code} --desired-value {vcpus})"
            )


def node_pool_zones(
    settings: Settings, zones: tuple[str, ...], placement: GpuPlacement
) -> dict[str, tuple[str, ...]]:
    """Each EKS node pool's zones: those of the stack that offer every type the pool may launch."""
    groups = {group.name: group for group in settings.node_groups}
    return {
        pool.name: placement.zones_for(groups[pool.node_group], zones, pool.instance_types)
        for pool in settings.section(Kubernetes).node_pools
    }


def node_pool_problems(settings: Settings, zones: tuple[str, ...], placement: GpuPlacement) -> Iterator[str]:
    """An EKS node pool no zone of the stack can launch, and a quota below the groups' max_size."""
    placed = node_pool_zones(settings, zones, placement)
    for index, pool in enumerate(settings.section(Kubernetes).node_pools):
        if placed[pool.name]:
            continue
        types = pool.instance_types or (
            next(g for g in settings.node_groups if g.name == pool.node_group).instance_type,
        )
        where = {t: ", ".join(placement.offered.get(t, ())) or "no zone of this region" for t in types}
        yield (
            f"kubernetes.node_pools[{index}] ({pool.name}): no availability zone of the stack ({', '.join(zones)}) "
            f"offers all of its instance types ({'; '.join(f'{t}: {z}' for t, z in where.items())})"
        )
    yield from _quota_problems(settings, placement)
