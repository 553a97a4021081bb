"""What a node group's fleet costs bought each way: on-demand, spot, a Capacity Block (`fab plan --explore`).

The fleet is the planner's (``plan.py``: nodes for the peak). Rows:

* **on-demand** — the nodes at the group's ``price_per_hour``.
* **spot** — where the group's ``capacity`` is spot and states its ``price_per_hour``: the on-demand
  base (and share above it) at the on-demand price, the rest at the spot price, plus the work lost
  to interruptions. A node of a type in band *b* of the Spot Instance Advisor is interrupted
  ``b / 730`` times an hour (the band's share of instances per month, 730 hours a month); each
  interruption costs a replacement's start, paid and not serving — at most
  ``rollout.readiness_timeout_s``, which the planner takes as the bound it is.
* **capacity block** — where the group runs in a Capacity Block stating its ``price_per_hour``.

Cost per 1M output tokens scales the on-demand fleet's figure by each row's price: the same nodes
serve the same tokens, whichever way they were bought.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from frontier.capacity.plan import GroupPlan, Plan
from frontier.capacity.plan_tables import Report, Table
from frontier.config.purchase import INTERRUPTION_BANDS, CapacityBlock, SpotCapacity
from frontier.config.schema import Settings

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class MarketRow:
    group: str
    market: str
    nodes: int
    cost_per_hour: float
    cost_per_million: float
    note: str


def spot_cost_per_hour(settings: Settings, plan: GroupPlan, spot: SpotCapacity) -> tuple[float, str]:
    """The fleet's hourly cost bought as ``spot`` says, and how it was reckoned."""
    assert spot.price_per_hour is not None
    od_price, nodes = plan.group.price_per_hour, plan.nodes
    base = min(spot.on_demand_base, nodes)
    above = nodes - base
    od_above = above * spot.on_demand_above_base_percent / 100
    spot_nodes = above - od_above
    if spot.interruption_frequency is None:
        lost, why = 0.0, "interruptions not counted (capacity.interruption_frequency unset)"
    else:
        per_hour = INTERRUPTION_BANDS[spot.interruption_frequency] / HOURS_PER_MONTH
        start_h = settings.rollout.readiness_timeout_s / 3600
        lost = per_hour * start_h
        why = (
            f"band {spot.interruption_frequency}: {INTERRUPTION_BANDS[spot.interruption_frequency]:.1%} of spot "
            f"nodes interrupted a month, each costing <= {settings.rollout.readiness_timeout_s:g} s of a start"
        )
    cost = (base + od_above) * od_price + spot_nodes * spot.price_per_hour * (1 + lost)
    return cost, f"{base + od_above:g} on-demand + {spot_nodes:g} spot at {spot.price_per_hour:g}/h; {why}"


def market_rows(settings: Settings, plan: Plan) -> list[MarketRow]:
    rows = []
    for group_plan in plan.groups:
        group = group_plan.group
        od_cost = group_plan.nodes * group.price_per_hour
        per_dollar = group_plan.fleet_cost_per_million_output_tokens / od_cost if od_cost else 0.0
        rows.append(
            MarketRow(group.name, "on-demand", group_plan.nodes, od_cost,
                      group_plan.fleet_cost_per_million_output_tokens, f"at {group.price_per_hour:g}/h")
        )  # fmt: skip
        capacity = group.capacity
        if isinstance(capacity, SpotCapacity) and capacity.price_per_hour is not None:
            cost, note = spot_cost_per_hour(settings, group_plan, capacity)
            rows.append(MarketRow(group.name, "spot", group_plan.nodes, cost, cost * per_dollar, note))
        elif isinstance(capacity, SpotCapacity):
            rows.append(
                MarketRow(
                    group.name,
                    "spot",
                    group_plan.nodes,
                    0.0,
                    0.0,
                    "not priced: capacity.price_per_hour unset",
                )
            )
        if isinstance(capacity, CapacityBlock) and capacity.price_per_hour is not None:
            cost = group_plan.nodes * capacity.price_per_hour
            note = f"{capacity.reservation_id} at {capacity.price_per_hour:g}/h until {capacity.end_time:%Y-%m-%d %H:%M}Z"
            rows.append(
                MarketRow(group.name, "capacity block", group_plan.nodes, cost, cost * per_dollar, note)
            )
    return rows


def market_report(settings: Settings, plan: Plan) -> Iterator[Report]:
    rows = market_rows(settings, plan)
    yield Table(
        f"buying the fleet of stack {settings.stack}",
        ("group", "market", "nodes", "$/hour", "$ per 1M output tokens", "how"),
        [
            (
                r.group,
                r.market,
                str(r.nodes),
                f"{r.cost_per_hour:,.2f}" if r.cost_per_hour else "-",
                f"{r.cost_per_million:,.3f}" if r.cost_per_million else "-",
                r.note,
            )
            for r in rows
        ],  # fmt: skip
        numeric=(2, 3, 4),
    )
