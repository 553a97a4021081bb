"""Which way a rollout keeps capacity, and the order of steps of a surge (a recording fleet).

The decision is pure; the surge's order is checked against a fleet that records what it is asked
to do (the auto scaling group itself is exercised with moto in tests/operate/test_fleet_ec2.py).
"""

from __future__ import annotations

import contextlib

from frontier.hosts.inventory import HostSpec
from frontier.rollout.rolling import HostResult, RolloutResult
from frontier.rollout.strategy import IN_PLACE, SURGE, GroupSize, choose, surge_rollout
from frontier.targets import load_stack

PROD = load_stack("prod").rollout  # max_surge 1, batch_size 1


def rollout(**changes):
    return PROD.model_copy(update=changes)


def test_surge_when_the_group_has_room_above_desired():
    strategy = choose(rollout(max_surge=2), GroupSize(4, 6, 10))
    assert (strategy.kind, strategy.hosts_per_wave) == (SURGE, 2)
    assert "max_size 10 leaves room for 4 above desired 6" in strategy.describe()


def test_surge_is_capped_by_the_room_left():
    assert choose(rollout(max_surge=3), GroupSize(1, 4, 5)).hosts_per_wave == 1


def test_one_unavailable_at_max_size_and_says_why():
    strategy = choose(rollout(max_surge=1, batch_size=1), GroupSize(2, 4, 4))
    assert (strategy.kind, strategy.hosts_per_wave) == (IN_PLACE, 1)
    assert strategy.describe() == (
        "one-unavailable: 1 host(s) out of service at a time "
        "(the group is at max_size (4 = desired 4): no room to surge)"
    )


def test_one_unavailable_without_surge_or_for_a_fixed_fleet():
    assert "rollout.max_surge is 0" in choose(rollout(max_surge=0), GroupSize(1, 2, 9)).describe()
    assert "a fixed fleet cannot grow" in choose(rollout(), None).describe()


def host(name: str) -> HostSpec:
    return HostSpec(name, "10.0.0.1", 22, "/opt/frontier", "h100", instance_id=f"i-{name}")


class RecordingFleet:
    def __init__(self) -> None:
        self.steps: list[str] = []
        self.launched = 0

    def size(self) -> GroupSize:
        return GroupSize(2, 3, 5)

    def grow(self, count: int, timeout_s: float) -> list[HostSpec]:
        new = [host(f"new{self.launched + i}") for i in range(count)]
        self.launched += count
        self.steps.append("grow " + ",".join(h.name for h in new))
        return new

    def retire(self, hosts: list[HostSpec]) -> None:
        self.steps.append("retire " + ",".join(h.name for h in hosts))

    def hold(self, hosts):
        return contextlib.nullcontext()


def roller(steps: list[str], fail_on: str = ""):
    def roll(hosts: list[HostSpec]) -> RolloutResult:
        names = ",".join(h.name for h in hosts)
        steps.append("roll " + names)
        failed = fail_on in names if fail_on else False
        return RolloutResult(
            "deploy",
            "r-1",
            outcome="rolled_back" if failed else "succeeded",
            reason="gate: error rate 5%" if failed else "",
            hosts=[
                HostResult(h.name, to_release="r-1", outcome="restored" if failed else "updated")
                for h in hosts
            ],
        )

    return roll


def test_a_surge_launches_gates_then_retires_wave_by_wave():
    fleet = RecordingFleet()
    old = [host("a"), host("b"), host("c")]
    strategy = choose(rollout(max_surge=2), fleet.size())
    result = surge_rollout(
        fleet, old, strategy, roller(fleet.steps), kind="deploy", release="r-1", launch_timeout_s=60
    )
    assert fleet.steps == [
        "grow new0,new1",
        "roll new0,new1",  # the new hosts get the release and pass the gate first
        "retire a,b",  # only then do old hosts go
        "grow new2",
        "roll new2",
        "retire c",
    ]
    assert result.outcome == "succeeded"
    assert result.strategy.startswith("surge: +2 host(s) first")
    outcomes = {h.name: h.outcome for h in result.hosts}
    assert outcomes == {
        "a": "retired",
        "b": "retired",
        "c": "retired",
        "new0": "updated",
        "new1": "updated",
        "new2": "updated",
    }


def test_a_failed_surge_wave_retires_its_new_hosts_and_leaves_the_old_ones_serving():
    fleet = RecordingFleet()
    old = [host("a"), host("b")]
    strategy = choose(rollout(max_surge=1), fleet.size())
    result = surge_rollout(
        fleet,
        old,
        strategy,
        roller(fleet.steps, fail_on="new1"),
        kind="deploy",
        release="r-1",
        launch_timeout_s=60,
    )
    assert fleet.steps == ["grow new0", "roll new0", "retire a", "grow new1", "roll new1", "retire new1"]
    assert (result.outcome, result.reason) == ("rolled_back", "gate: error rate 5%")
    outcomes = {h.name: h.outcome for h in result.hosts}
    assert outcomes == {"a": "retired", "b": "untouched", "new0": "updated", "new1": "retired"}
