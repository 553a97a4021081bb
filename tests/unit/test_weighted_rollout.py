"""The traffic-weighted rollout (``rollout.traffic_steps``): its setting's rules, its weights, and the
order of its steps and of its revert.

The host switch (drain, stop, swap, start, readiness, enable), the gates' scrapes and HAProxy's
weights run for real in tests/e2e/test_weighted_rollout.py and tests/unit/test_haproxy_live.py;
here the switch, the step gate and the balancer are recorded, to show the order the rollout takes
them in and what it does when a step fails or leaves no replica routable.
"""

from __future__ import annotations

import pytest

from frontier.errors import StackError
from frontier.hosts.inventory import HostSpec
from frontier.rollout.rolling import TrafficStep
from frontier.rollout.weighted import WeightedBalancer, WeightedRollout
from frontier.targets import backend_for, load_stack
from frontier.targets.local.balancer import HAProxyBalancer, balancer_backends, render_haproxy, split_weights

BAD_STEPS = [
    ([5, 25, 50], "[5, 25, 50]: the last step must be 100"),
    ([0, 50, 100], "every step must be a percent in 1..100, not 0"),
    ([5, 150], "every step must be a percent in 1..100, not 150"),
    ([50, 25, 100], "[50, 25, 100]: the steps must increase strictly"),
    ([25, 25, 100], "[25, 25, 100]: the steps must increase strictly"),
]


@pytest.mark.parametrize(("steps", "allowed"), BAD_STEPS, ids=[str(s) for s, _ in BAD_STEPS])
def test_traffic_steps_out_of_range_are_refused_at_load_naming_field_value_and_rule(
    changed_stack, steps, allowed
):
    path = changed_stack("local", {"rollout.traffic_steps": steps})
    with pytest.raises(StackError) as err:
        load_stack("local", path=path)
    assert "rollout.traffic_steps" in str(err.value) and allowed in str(err.value)


# A Kubernetes pool splits by replica ratio: tests/kubernetes/test_traffic_share_deploy.py.
# An EC2 stack whose ALB fronts its runtimes weighs two target groups: tests/operate/test_traffic_share_ec2.py.
def test_an_ec2_stack_behind_its_gateway_refuses_traffic_steps_at_load_saying_why(changed_stack):
    gateway = {
        "port": 8090,
        "metering": {"uri": "s3://frontier-prod-metering/metering"},
        "ami_id": "ami-0123456789abcdef0",
        "instance_type": "c7i.large",
        "request_timeout_s": 100,
    }
    path = changed_stack("prod", {"gateway": gateway, "rollout.traffic_steps": [5, 25, 100]})
    with pytest.raises(StackError) as err:
        load_stack("prod", path=path)
    message = str(err.value)
    assert "rollout.traffic_steps = [5, 25, 100]" in message
    assert "target group holds the gateway's hosts, not the runtimes" in message


def test_an_ec2_stack_whose_alb_fronts_its_runtimes_loads_with_traffic_steps(changed_stack):
    settings = load_stack("prod", path=changed_stack("prod", {"rollout.traffic_steps": [5, 25, 100]}))
    assert settings.gateway is None and settings.rollout.traffic_steps == (5, 25, 100)


@pytest.mark.parametrize(
    ("new", "old", "percent"),
    [(1, 1, 5), (1, 1, 25), (1, 1, 50), (1, 2, 5), (2, 1, 25), (1, 3, 1), (3, 4, 37), (1, 1, 100), (2, 3, 0)],
)
def test_split_weights_give_the_new_hosts_together_their_percent_of_the_requests(new, old, percent):
    new_weight, old_weight = split_weights(new, old, percent)
    assert 0 <= new_weight <= 256 and 0 <= old_weight <= 256
    share = 100 * new * new_weight / (new * new_weight + old * old_weight)
    assert abs(share - percent) < 1, (new_weight, old_weight, share)


def test_a_share_above_zero_keeps_a_weight_above_zero_where_weights_are_scaled_down():
    # 1 % on one host against 3 others: 3 : 99 fits; 1 % on 3 hosts against 4 needs no rounding to 0.
    assert split_weights(3, 4, 1)[0] >= 1 and split_weights(4, 3, 99)[1] >= 1


def test_split_weights_refuses_a_side_with_no_host():
    with pytest.raises(Exception, match="hosts on both sides"):
        split_weights(1, 0, 50)


def test_a_stack_rolling_by_traffic_share_balances_by_weighted_round_robin():
    # leastconn sends requests to idle servers in turn whatever their weights: the split needs round robin.
    settings = load_stack("local")
    weighted = settings.model_copy(
        update={"rollout": settings.rollout.model_copy(update={"traffic_steps": (25, 50, 100)})}
    )
    render = {"bind_port": 8080, "stats_socket": "/tmp/admin.sock"}
    assert "    balance leastconn\n" in render_haproxy(settings, balancer_backends(settings), **render)
    assert "    balance roundrobin\n" in render_haproxy(weighted, balancer_backends(weighted), **render)


def test_the_local_balancer_carries_weights():
    assert isinstance(backend_for(load_stack("local")).balancer(), WeightedBalancer)
    assert isinstance(HAProxyBalancer("/nonexistent"), WeightedBalancer)


# --- the order of the steps -------------------------------------------------------------------------


class RecordingBalancer:
    """Weights and rotation as HAProxy keeps them, without HAProxy: every call is recorded."""

    def __init__(self, names: list[str], unroutable_at: int | None = None) -> None:
        self.weight = dict.fromkeys(names, 1)
        self.up = set(names)
        self.calls: list[str] = []
        self.unroutable_at = unroutable_at

    def split(self, new: list[HostSpec], old: list[HostSpec], percent: int) -> None:
        self.calls.append(f"split {percent}")
        new_weight, old_weight = split_weights(len(new), len(old), percent)
        self.weight |= {h.name: new_weight for h in new} | {h.name: old_weight for h in old}
        if percent == self.unroutable_at:
            self.up.clear()  # every host's check failing at once, as a network partition would

    def even(self, hosts: list[HostSpec]) -> None:
        self.calls.append("even")
        self.weight |= {h.name: 1 for h in hosts}

    def routable(self, hosts: list[HostSpec]) -> list[str]:
        return [h.name for h in hosts if h.name in self.up and self.weight[h.name] > 0]

    def drain(self, host: HostSpec, timeout: float) -> int:
        self.up.discard(host.name)
        return 0

    def enable(self, host: HostSpec, timeout: float) -> None:
        self.up.add(host.name)

    def state(self, host: HostSpec) -> str:
        return "UP" if host.name in self.up else "MAINT"


class RecordingRollout(WeightedRollout):
    """Hosts that all serve r-old; switches and step gates recorded, the step at ``failing_at`` failing."""

    def __init__(self, hosts: list[HostSpec], balancer: RecordingBalancer, failing_at: int | None = None):
        settings = load_stack("local")
        rollout = settings.rollout.model_copy(update={"traffic_steps": (5, 50, 100), "canary_hosts": 1})
        stepped = settings.model_copy(update={"rollout": rollout})
        super().__init__(stepped, stepped.only_pool, hosts, balancer, lambda h: None)
        self.recorder = balancer
        self.failing_at = failing_at

    def _check_and_stage(self, release, wheel, results):  # noqa: ANN001
        for res in results.values():
            res.from_release = "r-old"
        return list(self.hosts)

    def _switch(self, wave, results, target, touched=None) -> None:  # noqa: ANN001
        for host in wave:
            if touched is not None:
                touched.append(host)
            self.recorder.drain(host, 0)
            self.recorder.calls.append(f"switch {host.name} to {target[host.name]}")
            self.recorder.enable(host, 0)

    def _hold_and_gate(self, step: TrafficStep, new, old) -> None:  # noqa: ANN001
        if step.percent == self.failing_at:
            step.outcome, step.reason = "failed", "p99 too slow"
            raise StackError(f"traffic step {step.percent} %: p99 too slow")
        step.outcome = "passed"

    def _prune(self, host: HostSpec) -> str:
        return "pruned"


class Release:
    id = "r-new"


def hosts(n: int) -> list[HostSpec]:
    return [HostSpec(f"host-{i}", f"10.0.0.{i}", 22, "/opt/frontier", "h100") for i in range(1, n + 1)]


def roll(n: int, **kwargs: object) -> tuple[object, RecordingBalancer]:
    balancer = RecordingBalancer([h.name for h in hosts(n)], unroutable_at=kwargs.pop("unroutable_at", None))
    result = RecordingRollout(hosts(n), balancer, **kwargs).run(Release(), None)
    return result, balancer


def test_the_canary_switches_at_zero_percent_then_takes_each_step_then_the_old_hosts_switch():
    result, balancer = roll(3)
    assert result.outcome == "succeeded", result.reason
    assert balancer.calls == [
        "split 0",
        "switch host-1 to r-new",
        "split 5",
        "split 50",
        "split 100",
        "switch host-2 to r-new",
        "switch host-3 to r-new",
        "even",
    ]
    assert [(s.percent, s.outcome, s.routable) for s in result.steps] == [
        (5, "passed", 3),
        (50, "passed", 3),
        (100, "passed", 1),
    ]
    assert {h.outcome for h in result.hosts} == {"updated"}


def test_a_failed_step_sends_all_traffic_back_to_the_old_release_before_the_canary_is_restored():
    result, balancer = roll(2, failing_at=50)
    assert result.outcome == "rolled_back"
    assert result.reason == "traffic step 50 %: p99 too slow"
    assert balancer.calls == [
        "split 0",
        "switch host-1 to r-new",
        "split 5",
        "split 50",
        "split 0",  # the revert: the old host takes everything first
        "switch host-1 to r-old",
        "even",
    ]
    assert [(s.percent, s.outcome) for s in result.steps] == [(5, "passed"), (50, "failed")]
    assert [h.outcome for h in result.hosts] == ["restored", "untouched"]


def test_a_step_that_leaves_no_replica_routable_stops_the_rollout_and_reverts():
    result, balancer = roll(2, unroutable_at=50)
    assert result.outcome == "rolled_back"
    assert result.reason.startswith("0 routable (none) after 50 % of traffic on the new release")
    assert "split 100" not in balancer.calls
    # Nothing routable after the revert's split either: every host that passes its check serves.
    assert balancer.calls[4:] == ["split 0", "even", "switch host-1 to r-old", "even"]


def test_a_pool_of_one_host_is_refused_before_anything_is_touched():
    result, balancer = roll(1)
    assert result.outcome == "rolled_back"
    assert "needs at least 2" in result.reason
    assert balancer.calls == []
    assert [h.outcome for h in result.hosts] == ["untouched"]


def test_the_canaries_leave_the_last_host_of_the_old_release_to_carry_the_rest():
    rollout = RecordingRollout(hosts(3), RecordingBalancer([h.name for h in hosts(3)]))
    rollout.settings = rollout.settings.model_copy(
        update={"rollout": rollout.settings.rollout.model_copy(update={"canary_hosts": 5})}
    )
    assert rollout._canaries(hosts(3), hosts(3)) == hosts(3)[:2]
    # host-1 already runs the release; of the two left, host-3 is the last to serve the old one.
    assert rollout._canaries(hosts(3)[1:], hosts(3)[1:]) == [hosts(3)[1]]


def test_a_deploys_summary_shows_each_traffic_step_with_its_verdict():
    from rich.console import Console

    from frontier.cli.ops import _summary

    result, _ = roll(2, failing_at=50)
    console = Console(record=True, width=200)
    _summary(console, result)
    shown = console.export_text()
    assert "traffic steps of deploy r-new" in shown
    steps = shown.partition("traffic steps of deploy r-new")[2]
    rows = [line.replace("│", " ").split()[:3] for line in steps.splitlines() if line.startswith("│")]
    assert rows == [["5", "%", "passed"], ["50", "%", "failed"]]
    assert "p99 too slow" in steps


def test_the_deploy_locks_horizon_covers_every_step_held_for_its_longest():
    from frontier.rollout.deploy import lock_ttl_s
    from frontier.rollout.weighted import MAX_WINDOWS

    settings = load_stack("local")
    slow = settings.rollout.model_copy(
        update={"gate": settings.rollout.gate.model_copy(update={"window_s": 600}), "traffic_steps": ()}
    )
    stepped = slow.model_copy(update={"traffic_steps": (5, 25, 50, 100)})
    by_host = lock_ttl_s(settings.model_copy(update={"rollout": slow}), settings.only_pool, 2)
    by_share = lock_ttl_s(settings.model_copy(update={"rollout": stepped}), settings.only_pool, 2)
    assert by_share >= 2 * 4 * MAX_WINDOWS * 600 > by_host


def test_a_local_pool_whose_replica_spans_nodes_refuses_traffic_steps_at_load(changed_stack):
    replica = {"runtime.nodes_per_replica": 2, "runtime.pipeline_parallel_size": 2}
    path = changed_stack("local", {"rollout.traffic_steps": [50, 100], **replica})
    with pytest.raises(StackError) as err:
        load_stack("local", path=path)
    assert "rollout.traffic_steps = [50, 100]" in str(err.value)
    assert "spans 2 nodes (runtime.nodes_per_replica): its nodes cannot take different shares" in str(
        err.value
    )
