"""A node group's ``capacity:`` in a stack file (frontier/config/purchase.py): spot above an
on-demand base over types with the same GPUs, or a Capacity Block with its fallback group. Each
bad value is refused at load time naming the field, the value and what is allowed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from frontier.config.purchase import INSTANCE_GPUS, CapacityBlock, SpotCapacity
from frontier.errors import StackError
from frontier.targets import load_stack

SPOT = {"market": "spot", "on_demand_base": 2}
BLOCK = {
    "market": "capacity-block",
    "reservation_id": "cr-0123456789abcdef0",
    "end_time": "2027-01-15T11:30:00Z",
    "fallback_group": "h100",
}


def _refusal(path) -> str:
    with pytest.raises(StackError) as err:
        load_stack("prod", path=path)
    return str(err.value)


def test_a_spot_group_loads_with_capacity_optimized_allocation_and_rebalancing_by_default(changed_stack):
    settings = load_stack("prod", path=changed_stack("prod", {"node_groups[0].capacity": SPOT}))
    spot = settings.node_groups[0].capacity
    assert isinstance(spot, SpotCapacity)
    assert (spot.on_demand_base, spot.on_demand_above_base_percent) == (2, 0)
    assert spot.allocation_strategy == "capacity-optimized" and spot.capacity_rebalance is True


def test_a_group_without_capacity_buys_on_demand(changed_stack):
    assert load_stack("prod").node_groups[0].capacity is None


def test_an_instance_type_with_another_gpu_is_refused_naming_both(changed_stack):
    path = changed_stack(
        "prod", {"node_groups[0].capacity": {**SPOT, "instance_types": ["p5en.48xlarge", "p4d.24xlarge"]}}
    )
    message = _refusal(path)
    assert "capacity.instance_types[0]" in message and "p5en.48xlarge" in message
    assert "8 x H200-SXM-141GB" in message and "8 x H100-SXM-80GB" in message
    assert "capacity.instance_types[1]" in message and "A100-SXM-40GB" in message


def test_an_instance_type_with_another_gpu_count_is_refused(changed_stack):
    message = _refusal(
        changed_stack("prod", {"node_groups[0].capacity": {**SPOT, "instance_types": ["p5.4xlarge"]}})
    )
    assert (
        "p5.4xlarge" in message and "1 x H100-SXM-80GB" in message and "same GPU model and count" in message
    )


def test_an_unknown_instance_type_is_refused_naming_the_known_ones(changed_stack):
    message = _refusal(
        changed_stack("prod", {"node_groups[0].capacity": {**SPOT, "instance_types": ["p9.huge"]}})
    )
    assert "capacity.instance_types[0]" in message and "'p9.huge'" in message and "p5e.48xlarge" in message


def test_an_on_demand_base_above_the_groups_maximum_is_refused(changed_stack):
    message = _refusal(changed_stack("prod", {"node_groups[0].capacity": {**SPOT, "on_demand_base": 11}}))
    assert "capacity.on_demand_base" in message and "11" in message and "max_size (10)" in message


def test_a_percentage_or_strategy_out_of_range_is_refused(changed_stack):
    message = _refusal(
        changed_stack("prod", {"node_groups[0].capacity": {**SPOT, "on_demand_above_base_percent": 101}})
    )
    assert "on_demand_above_base_percent" in message and "101" in message
    message = _refusal(
        changed_stack("prod", {"node_groups[0].capacity": {**SPOT, "allocation_strategy": "lowest-price"}})
    )
    assert "allocation_strategy" in message and "capacity-optimized" in message


def test_a_capacity_block_drains_forty_minutes_before_it_ends(changed_stack):
    block = CapacityBlock.model_validate({**BLOCK, "fallback_group": "od"})
    assert block.drain_at == datetime(2027, 1, 15, 10, 50, tzinfo=UTC)


def test_a_capacity_block_end_without_a_time_zone_is_refused(changed_stack):
    path = changed_stack("prod", {"node_groups[0].capacity": {**BLOCK, "end_time": "2027-01-15T11:30:00"}})
    message = _refusal(path)
    assert "end_time" in message and "time zone" in message


def test_a_capacity_block_must_fall_back_to_another_group_of_the_stack(changed_stack):
    message = _refusal(changed_stack("prod", {"node_groups[0].capacity": BLOCK}))
    assert "capacity.fallback_group" in message and "another node group" in message
    message = _refusal(
        changed_stack("prod", {"node_groups[0].capacity": {**BLOCK, "fallback_group": "a100"}})
    )
    assert "'a100'" in message and "must name one of node_groups (h100)" in message


def test_a_reservation_id_that_is_not_one_is_refused(changed_stack):
    message = _refusal(
        changed_stack("prod", {"node_groups[0].capacity": {**BLOCK, "reservation_id": "cb-1"}})
    )
    assert "reservation_id" in message and "cb-1" in message


def test_every_type_in_the_gpu_table_names_a_gpu_and_a_count():
    assert all(count in (1, 4, 8) and model for model, count in INSTANCE_GPUS.values())


def _cloud_init(settings) -> dict:
    import yaml

    from frontier.render.boot import render_cloud_init

    text = render_cloud_init(
        settings, settings.node_groups[0], history_bucket="frontier-prod-history", launch_timeout_s=900
    )
    return yaml.safe_load(text.split("\n", 1)[1] if text.startswith("#cloud-config") else text)


def test_a_spot_groups_hosts_run_the_interruption_watcher_every_5_s(changed_stack):
    config = _cloud_init(load_stack("prod", path=changed_stack("prod", {"node_groups[0].capacity": SPOT})))
    units = {f["path"]: f["content"] for f in config["write_files"]}
    unit = units["/etc/systemd/system/frontier-interruptions.service"]
    assert (
        "frontier-agent.py --config /opt/frontier/bin/frontier-agent.json interruptions --interval 5" in unit
    )
    boot = next(f["content"] for f in config["write_files"] if 'frontier-bootstrap.py" boot' in f["content"])
    assert "systemctl enable --now frontier-interruptions.service" in boot


def test_an_on_demand_groups_hosts_run_no_interruption_watcher():
    config = _cloud_init(load_stack("prod"))
    assert all("frontier-interruptions" not in f["path"] for f in config["write_files"])
