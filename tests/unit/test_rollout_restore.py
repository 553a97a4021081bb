"""A failed wave goes back to the releases its hosts ran before: host by host on a stack of one-node
replicas, a whole replica at a time where a replica spans several nodes (its nodes must never run
two releases: the leader would refuse the others).

The switch itself (drain, stop, swap, start, readiness) is what the rollout e2e tests run over real
sshd; here it is recorded, to show which hosts each restore takes together.
"""

from __future__ import annotations

from frontier.hosts.inventory import HostSpec
from frontier.rollout.rolling import HostResult, Rollout
from frontier.targets import load_stack


class RecordingRollout(Rollout):
    def __init__(self, stack: str, hosts: list[HostSpec], failing: set[str] = frozenset()) -> None:
        settings = load_stack(stack)
        super().__init__(settings, settings.only_pool, hosts, balancer=NoBalancer(), connect=lambda host: None)
        self.switched: list[list[str]] = []
        self.failing = failing

    def _switch(self, wave, results, target, touched=None) -> None:  # noqa: ANN001
        self.switched.append([h.name for h in wave])
        assert all(target[h.name] == "r-old" for h in wave)
        if self.failing & {h.name for h in wave}:
            raise RuntimeError("readiness timed out")


class NoBalancer:
    def __init__(self) -> None:
        self.enabled: list[str] = []

    def enable(self, host: HostSpec, timeout_s: float) -> None:
        self.enabled.append(host.name)


def hosts(n: int) -> list[HostSpec]:
    return [HostSpec(f"host-{i}", f"10.0.0.{i}", 22, "/opt/frontier", "h100") for i in range(1, n + 1)]


def results(of: list[HostSpec]) -> dict[str, HostResult]:
    return {h.name: HostResult(h.name, from_release="r-old", to_release="r-new") for h in of}


def test_one_node_replicas_are_restored_host_by_host():
    touched = hosts(3)
    rollout, res = RecordingRollout("prod", touched), results(touched)
    assert rollout._restore(touched, res)
    assert rollout.switched == [["host-1"], ["host-2"], ["host-3"]]
    assert {r.outcome for r in res.values()} == {"restored"}


def test_a_replica_over_two_nodes_is_restored_as_one_unit():
    touched = hosts(4)
    rollout, res = RecordingRollout("prod-multinode", touched), results(touched)
    assert rollout._restore(touched, res)
    assert rollout.switched == [["host-1", "host-2"], ["host-3", "host-4"]]
    assert {r.outcome for r in res.values()} == {"restored"}


def test_a_replica_that_cannot_come_back_fails_whole_and_the_next_is_still_restored():
    touched = hosts(4)
    rollout, res = RecordingRollout("prod-multinode", touched, failing={"host-2"}), results(touched)
    assert not rollout._restore(touched, res)
    assert [res[h].outcome for h in ("host-1", "host-2", "host-3", "host-4")] == [
        "failed",
        "failed",
        "restored",
        "restored",
    ]
    assert rollout.balancer.enabled == ["host-1", "host-2"]  # left to the balancer's health check
