"""The balancer of runtimes behind a gateway (:mod:`frontier.hosts.gateway_fronted`): what its drain
says it knows, and what its enable waits for.

The host is a stand-in for its agent's ``stop`` and ``status`` (the agent itself, and a deploy
through this balancer, are tested against real hosts' agents and moto's server elsewhere:
tests/operate/test_host_agent.py, tests/operate/test_disaggregated_roll_ec2.py): its stop takes as
long as a runtime's drain would, which is all the balancer reads of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from frontier.hosts.balancer import BalancerError
from frontier.hosts.gateway_fronted import GatewayFronted
from frontier.hosts.inventory import HostSpec
from frontier.hosts.session import HostFacts

HOST = HostSpec(name="gpu-1", address="10.0.1.7", ssh_port=22, root="/opt/frontier", group="h100")


@dataclass
class Agent:
    """A host's agent: its runtime stops after ``drain_s``, answers ready once ``ready``."""

    drain_s: float = 0.0
    ready: bool = True
    running: bool = True
    calls: list[str] = field(default_factory=list)

    def stop(self) -> str:
        self.calls.append("stop")
        time.sleep(self.drain_s)
        self.running = self.ready = False
        return "terminated"

    def status(self) -> HostFacts:
        self.calls.append("status")
        return HostFacts(running=self.running, ready=self.ready)

    def close(self) -> None:
        self.calls.append("close")


def balancer(agent: Agent, runtime_drain_s: float = 5.0) -> GatewayFronted:
    return GatewayFronted(lambda host: agent, runtime_drain_s=runtime_drain_s, probe_round_s=0.0, poll_s=0.01)


def test_a_drain_stops_the_runtime_through_its_agent_and_closes_the_session():
    agent = Agent()
    balancer(agent).drain(HOST, timeout=5)
    assert agent.calls == ["stop", "close"]


def test_a_runtime_that_exits_before_its_drain_timeout_left_no_session_open():
    assert balancer(Agent(drain_s=0.05), runtime_drain_s=5).drain(HOST, timeout=5) == 0


def test_a_runtime_that_ran_to_its_drain_timeout_reports_an_unknown_count_not_a_made_up_one():
    assert balancer(Agent(drain_s=0.2), runtime_drain_s=0.1).drain(HOST, timeout=5) is None


def test_a_drain_that_outlasts_its_own_timeout_reports_an_unknown_count():
    assert balancer(Agent(drain_s=0.2), runtime_drain_s=5).drain(HOST, timeout=0.1) is None


def test_enable_returns_once_the_runtime_answers_ready():
    agent = Agent(ready=True)
    balancer(agent).enable(HOST, timeout=1)
    assert agent.calls == ["status", "close"]


def test_enable_of_a_runtime_that_never_turns_ready_names_the_host_and_what_it_is():
    with pytest.raises(BalancerError, match=r"gpu-1: the runtime is not ready 0s after enabling it"):
        balancer(Agent(ready=False)).enable(HOST, timeout=0.05)


def test_the_state_is_the_runtimes_readiness_as_its_agent_reads_it():
    assert balancer(Agent(ready=True)).state(HOST) == "ready"
    assert balancer(Agent(ready=False)).state(HOST) == "not ready"
    assert balancer(Agent(ready=False, running=False)).state(HOST) == "stopped"
