"""How a node group buys its hosts: on-demand (the default), spot above an on-demand base, or a Capacity Block.

A node group's ``capacity:`` section (``NodeGroup.capacity``), one of two markets:

``market: spot`` — an on-demand base of ``on_demand_base`` hosts, then ``on_demand_above_base_percent``
on-demand above it (0: all spot), over the group's instance type and the ``instance_types`` listed
beside it, which must carry the same GPU model and count (a replica's tensor-parallel layout and its
memory fit are the GPU's, whichever type the spot market gives). Spot hosts are allocated
capacity-optimized (the pools least likely to be interrupted) and with capacity rebalancing on: the
auto scaling group launches a replacement when a host gets a rebalance recommendation, before the
two-minute interruption notice.

``market: capacity-block`` — the group's hosts run in a Capacity Block for ML (a capacity
reservation ``cr-…`` bought for 1-182 days; its instances end at ``end_time``, 11:30 UTC on the last
day). ``warning_minutes`` before the end (40, as AWS warns) the group drains to zero and
``fallback_group`` — another node group of the stack serving the same pool's model — takes its size:
both as scheduled actions on the auto scaling groups (infra/interruptions.py), so the move happens
without any operator or deploy-side process running, and each host leaves through the group's
terminate lifecycle hook, whose ``watch`` drains it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Annotated, Literal, Protocol

from frontier_settings import FieldProblem, FieldProblems
from pydantic import BaseModel, ConfigDict, Field, field_validator

# Instance type -> (GPU model, GPUs per instance). Source: the EC2 accelerated computing instance
# pages (https://aws.amazon.com/ec2/instance-types/ "Accelerated Computing", GPU and GPU memory
# columns). Types of one family size share the GPU; the count differs by size.
INSTANCE_GPUS: dict[str, tuple[str, int]] = {
    **{f"g5.{s}": ("A10G-24GB", 1) for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g5.12xlarge": ("A10G-24GB", 4),
    "g5.24xlarge": ("A10G-24GB", 4),
    "g5.48xlarge": ("A10G-24GB", 8),
    **{f"g6.{s}": ("L4-24GB", 1) for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g6.12xlarge": ("L4-24GB", 4),
    "g6.24xlarge": ("L4-24GB", 4),
    "g6.48xlarge": ("L4-24GB", 8),
    **{f"g6e.{s}": ("L40S-48GB", 1) for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g6e.12xlarge": ("L40S-48GB", 4),
    "g6e.24xlarge": ("L40S-48GB", 4),
    "g6e.48xlarge": ("L40S-48GB", 8),
    "p4d.24xlarge": ("A100-SXM-40GB", 8),
    "p4de.24xlarge": ("A100-SXM-80GB", 8),
    "p5.4xlarge": ("H100-SXM-80GB", 1),
    "p5.48xlarge": ("H100-SXM-80GB", 8),
    "p5e.48xlarge": ("H200-SXM-141GB", 8),
    "p5en.48xlarge": ("H200-SXM-141GB", 8),
    "p6-b200.48xlarge": ("B200-180GB", 8),
}

WARNING_MINUTES = 40
# The Spot Instance Advisor's bands (share of a type's spot instances interrupted over the trailing
# month) and the share the planner takes for each: the band's middle, 25 % for ">20%".
INTERRUPTION_BANDS: dict[str, float] = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}


def notice_queue_name(stack: str) -> str:
    """The stack's SQS queue of EC2 interruption notices (infra/interruptions.py creates it,
    ``fab status`` reads it): known by name, so nothing needs to export it."""
    return f"frontier-{stack}-interruptions"


def has_notice_queue(node_groups: Iterable[_Named]) -> bool:
    """Whether the stack keeps that queue: where a node group buys spot or a Capacity Block (an
    on-demand host gets no notice). ``node_groups``: the stack's (each with its ``capacity``)."""
    return any(group.capacity is not None for group in node_groups)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpotCapacity(_Model):
    market: Literal["spot"]
    on_demand_base: int = Field(default=0, ge=0, le=1000)
    on_demand_above_base_percent: int = Field(default=0, ge=0, le=100)
    instance_types: tuple[str, ...] = Field(
        default=(), max_length=19, description="Types besides the group's own, with the same GPUs."
    )
    allocation_strategy: Literal[
        "capacity-optimized", "capacity-optimized-prioritized", "price-capacity-optimized"
    ] = "capacity-optimized"
    capacity_rebalance: bool = True
    # The planner's inputs (`fab plan --explore`'s market rows): the spot price of the group's type
    # in the region (`aws ec2 describe-spot-price-history`), and the Spot Instance Advisor's
    # frequency-of-interruption band for it (https://aws.amazon.com/ec2/spot/instance-advisor/).
    price_per_hour: float | None = Field(default=None, ge=0, le=10_000)
    interruption_frequency: Literal["<5%", "5-10%", "10-15%", "15-20%", ">20%"] | None = None


class CapacityBlock(_Model):
    market: Literal["capacity-block"]
    reservation_id: str = Field(pattern=r"^cr-([0-9a-f]{8}|[0-9a-f]{17})$")
    end_time: datetime
    fallback_group: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    warning_minutes: int = Field(default=WARNING_MINUTES, ge=1, le=1440)
    # The block's price per instance-hour (its offering's upfront fee over its hours:
    # `aws ec2 describe-capacity-block-offerings`), for the planner's market rows.
    price_per_hour: float | None = Field(default=None, ge=0, le=10_000)

    @field_validator("end_time")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                "must carry its time zone (Capacity Blocks end at 11:30 UTC: write ...T11:30:00Z)"
            )
        return value

    @property
    def drain_at(self) -> datetime:
        """When the group drains and the fallback takes over: ``warning_minutes`` before the end."""
        return self.end_time - timedelta(minutes=self.warning_minutes)


GroupCapacity = Annotated[SpotCapacity | CapacityBlock, Field(discriminator="market")]


def gpus_of(instance_type: str) -> tuple[str, int] | None:
    return INSTANCE_GPUS.get(instance_type)


def spot_problems(instance_type: str, max_size: int, spot: SpotCapacity) -> list[FieldProblem]:
    """What is wrong with ``spot`` for a group of ``instance_type`` (paths under ``capacity``)."""
    problems = []
    if spot.on_demand_base > max_size:
        problems.append(
            FieldProblem(
                "capacity.on_demand_base",
                spot.on_demand_base,
                f"must be at most the group's max_size ({max_size})",
            )
        )
    own = gpus_of(instance_type)
    known = ", ".join(sorted(INSTANCE_GPUS))
    if own is None and spot.instance_types:
        problems.append(
            FieldProblem(
                "instance_type",
                instance_type,
                f"has no GPU facts to match other types against; known: {known}",
            )
        )
        return problems
    for i, other in enumerate(spot.instance_types):
        theirs = gpus_of(other)
        if theirs is None:
            problems.append(
                FieldProblem(
                    f"capacity.instance_types[{i}]", other, f"is not a known GPU type; known: {known}"
                )
            )
        elif own is not None and theirs != own:
            problems.append(
                FieldProblem(
                    f"capacity.instance_types[{i}]",
                    other,
                    f"has {theirs[1]} x {theirs[0]}; the group's {instance_type} has {own[1]} x {own[0]}: "
                    "every type of a group must carry the same GPU model and count",
                )
            )
        elif other == instance_type or other in spot.instance_types[:i]:
            problems.append(FieldProblem(f"capacity.instance_types[{i}]", other, "is listed twice"))
    return problems


def block_problems(group_name: str, block: CapacityBlock, groups: dict[str, int]) -> list[FieldProblem]:
    """A Capacity Block's fallback must be another node group of the stack (``groups``: name -> max_size)."""
    path = f"node_groups[{group_name}].capacity.fallback_group"
    if block.fallback_group == group_name:
        return [FieldProblem(path, block.fallback_group, "must be another node group, not the block's own")]
    if block.fallback_group not in groups:
        return [
            FieldProblem(path, block.fallback_group, f"must name one of node_groups ({', '.join(groups)})")
        ]
    return []


def check_spot(instance_type: str, max_size: int, capacity: SpotCapacity | CapacityBlock | None) -> None:
    if isinstance(capacity, SpotCapacity):
        problems = spot_problems(instance_type, max_size, capacity)
        if problems:
            raise FieldProblems(*problems)


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def capacity(self) -> SpotCapacity | CapacityBlock | None: ...


def falls_back_to(block_group: _Named, group: _Named) -> bool:
    """``group`` is the fallback of ``block_group``'s Capacity Block: it serves the same pool."""
    block = block_group.capacity
    return isinstance(block, CapacityBlock) and block.fallback_group == group.name
