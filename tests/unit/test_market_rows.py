"""The planner's market rows (frontier/capacity/markets.py): one fleet bought on-demand, as spot with
its interruptions counted, and in a Capacity Block, from the prices the stack states."""

from __future__ import annotations

import pytest

from frontier.capacity.markets import HOURS_PER_MONTH, market_report, market_rows
from frontier.capacity.plan import plan_stack
from frontier.capacity.plan_tables import Table
from frontier.targets import load_stack

SPOT = {
    "market": "spot",
    "on_demand_base": 2,
    "price_per_hour": 40.0,
    "interruption_frequency": "5-10%",
}


def _rows(settings):
    return {r.market: r for r in market_rows(settings, plan_stack(settings, settings.only_pool, None))}


def test_an_on_demand_group_has_one_row_at_its_own_price():
    settings = load_stack("prod")
    plan = plan_stack(settings, settings.only_pool, None).groups[0]
    rows = _rows(settings)
    assert list(rows) == ["on-demand"]
    assert rows["on-demand"].cost_per_hour == pytest.approx(plan.nodes * 98.32)
    assert rows["on-demand"].cost_per_million == pytest.approx(plan.fleet_cost_per_million_output_tokens)


def test_spot_pays_the_base_on_demand_the_rest_at_the_spot_price_and_its_interruptions(changed_stack):
    settings = load_stack("prod", path=changed_stack("prod", {"node_groups[0].capacity": SPOT}))
    nodes = plan_stack(settings, settings.only_pool, None).groups[0].nodes
    rows = _rows(settings)
    lost = 0.075 / HOURS_PER_MONTH * settings.rollout.readiness_timeout_s / 3600
    want = 2 * 98.32 + (nodes - 2) * 40.0 * (1 + lost)
    assert rows["spot"].cost_per_hour == pytest.approx(want)
    od = rows["on-demand"]
    assert rows["spot"].cost_per_million == pytest.approx(od.cost_per_million * want / od.cost_per_hour)
    assert "band 5-10%" in rows["spot"].note


def test_spot_without_a_band_says_its_interruptions_are_not_counted(changed_stack):
    spot = {k: v for k, v in SPOT.items() if k != "interruption_frequency"}
    settings = load_stack("prod", path=changed_stack("prod", {"node_groups[0].capacity": spot}))
    row = _rows(settings)["spot"]
    assert "interruptions not counted" in row.note and "interruption_frequency" in row.note


def test_spot_without_a_price_is_a_row_saying_so(changed_stack):
    settings = load_stack("prod", path=changed_stack("prod", {"node_groups[0].capacity": {"market": "spot"}}))
    row = _rows(settings)["spot"]
    assert row.cost_per_hour == 0 and "capacity.price_per_hour unset" in row.note


def test_a_capacity_block_is_priced_per_instance_hour(changed_stack):
    path = changed_stack("prod", {})
    import yaml

    document = yaml.safe_load(path.read_text())
    groups = document["config"]["frontier:node_groups"]
    groups.append({k: v for k, v in groups[0].items() if k != "schedule"} | {"name": "h100-od"})
    groups[0]["capacity"] = {
        "market": "capacity-block",
        "reservation_id": "cr-0123456789abcdef0",
        "end_time": "2027-01-15T11:30:00Z",
        "fallback_group": "h100-od",
        "price_per_hour": 31.46,
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    settings = load_stack("prod", path=path)
    nodes = plan_stack(settings, settings.only_pool, None).groups[0].nodes
    row = next(
        r
        for r in market_rows(settings, plan_stack(settings, settings.only_pool, None))
        if r.market == "capacity block"
    )
    assert row.group == "h100" and row.cost_per_hour == pytest.approx(nodes * 31.46)
    assert "cr-0123456789abcdef0" in row.note and "2027-01-15 11:30Z" in row.note


def test_the_report_is_one_table_with_a_row_per_market(changed_stack):
    settings = load_stack("prod", path=changed_stack("prod", {"node_groups[0].capacity": SPOT}))
    (table,) = market_report(settings, plan_stack(settings, settings.only_pool, None))
    assert isinstance(table, Table) and [row[1] for row in table.rows] == ["on-demand", "spot"]
