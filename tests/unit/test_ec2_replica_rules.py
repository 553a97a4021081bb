"""The EC2 target's rules for a group whose replica spans several nodes: whole replicas only.

Each case changes one value of ``stacks/Pulumi.prod-multinode.yaml`` (2 nodes per replica) and asks
the EC2 rules what they refuse; the message names the field, the value and the replica's size.
"""

from __future__ import annotations

import pytest

from frontier.config.schema import Settings
from frontier.targets import load_stack
from frontier.targets.ec2.rules import stack_problems


def multinode() -> Settings:
    return load_stack("prod-multinode")


def with_group(settings: Settings, **changes: object) -> Settings:
    group = settings.node_groups[0].model_copy(update=changes)
    return settings.model_copy(update={"node_groups": (group, *settings.node_groups[1:])})


def problems(settings: Settings) -> list[str]:
    return [str(p) for p in stack_problems(settings)]


def test_the_multinode_stack_loads_with_no_problems() -> None:
    settings = load_stack("prod-multinode")  # every rule of the stack, the EC2 target's included
    assert (settings.runtime.nodes_per_replica, settings.serving_group.instance_type) == (2, "p5.48xlarge")


@pytest.mark.parametrize(
    ("field", "sizes"),
    [
        ("min_size", {"min_size": 3, "desired_size": 4, "max_size": 8}),
        ("desired_size", {"min_size": 4, "desired_size": 5, "max_size": 8}),
        ("max_size", {"min_size": 4, "desired_size": 4, "max_size": 7}),
    ],
)
def test_a_group_size_that_is_not_whole_replicas_is_refused(field: str, sizes: dict[str, int]) -> None:
    [problem] = problems(with_group(multinode(), **sizes))
    assert problem.startswith(f"node_groups[0].{field} = {sizes[field]}:")
    assert "multiple of 2" in problem and "runtime.nodes_per_replica = 2" in problem


def test_a_schedule_floor_that_is_not_whole_replicas_is_refused() -> None:
    settings = multinode()
    schedule = settings.serving_group.schedule
    assert schedule is not None
    window = schedule.windows[0].model_copy(update={"min_size": 5})
    odd = with_group(settings, schedule=schedule.model_copy(update={"windows": (window,)}))
    [problem] = problems(odd)
    assert (
        problem.startswith("node_groups[0].schedule.windows[0].min_size = 5:") and "multiple of 2" in problem
    )


@pytest.mark.parametrize("field", ["canary_hosts", "batch_size"])
def test_a_rollout_wave_that_would_split_a_replica_is_refused(field: str) -> None:
    settings = multinode()
    split = settings.model_copy(update={"rollout": settings.rollout.model_copy(update={field: 3})})
    [problem] = problems(split)
    assert problem.startswith(f"rollout.{field} = 3:")
    assert "multiple of runtime.nodes_per_replica (2)" in problem


def test_a_static_inventory_is_refused_for_a_group_whose_replica_spans_nodes() -> None:
    settings = multinode()
    static = settings.model_copy(
        update={"inventory": settings.inventory.model_copy(update={"source": "static"})}
    )
    assert any(
        p.startswith("inventory.source = 'static':") and "auto scaling group" in p for p in problems(static)
    )


def test_a_group_whose_replica_fits_a_node_may_take_any_size() -> None:
    settings = load_stack("prod")
    assert problems(with_group(settings, min_size=3, desired_size=5, max_size=7)) == []
