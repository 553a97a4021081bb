"""An EC2 deploy holds its canary to the release it replaces, as the local stack's does: its answers
(``rollout.verify_canary``, the verification set through a tunnel to the canary's runtime, the key
read from Secrets Manager) and its p99 (``rollout.gate.max_p99_ratio``, against a host still on
the old release over the same window). A canary that fails either is retired and nothing else
changes. The surge wave's canary is new, so its yardstick is an old host outside the wave.

Real: the EC2 backend's roll (the auto scaling group in moto, in process: surge, hold, retire;
the history and the key in moto's S3 and Secrets Manager), the per-host rollout's algorithm with its
gate and verification judgments, and the runtimes' API answers over sockets (tests/openai_standin.py).
Simulated: each host's side (moto's instances have no sshd and no runtime), by
:class:`SimulatedHost`, which runs the release it was switched to and answers /metrics as that
release's runtime would; and the target group, by :class:`Rotation` (moto's has no health checks).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import boto3
import pytest
from frontier_hostside import names
from frontier_hostside.agent import Facts
from test_fleet_ec2 import REGION, prod  # noqa: F401 - prod is a fixture

from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.release import Release
from frontier.rollout.rolling import Rollout
from frontier.targets.ec2.backend import Ec2Backend
from tests.openai_standin import API_KEY, openai_standin

ROUTE = "/v1/chat/completions"
SET = """
cases:
  - {name: answered, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 4}, expect: {status: 200}}
  - {name: greedy, kind: golden, route: completions, request: {prompt: once, max_tokens: 4}}
"""


def release(note: str) -> Release:
    return Release(Artifact("sha256:" + "a" * 64, "image"), {"runtime.yaml": f"note: {note}\n"})


RELEASE_A, FAST_B, SLOW_B, WRONG_B = (release(n) for n in ("a", "fast", "slow", "wrong"))


@dataclass
class World:
    """What each release's runtime does, and what each host runs."""

    answers: dict[str, tuple[str, int]]
    slow: set[str] = field(default_factory=set)
    runs: dict[str, str] = field(default_factory=dict)
    scrapes: dict[str, int] = field(default_factory=dict)


class Relay:
    """``conn.forward_local`` as Fabric gives it: a local port joined to what the host reaches."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target

    @contextlib.contextmanager
    def forward_local(self, local_port: int, remote_port: int, remote_host: str) -> Iterator[None]:
        listener = socket.create_server(("127.0.0.1", local_port))
        listener.settimeout(0.2)
        done = threading.Event()

        def pipe(client: socket.socket) -> None:
            with client, socket.create_connection(self.target) as upstream:
                peers = {client: upstream, upstream: client}
                while True:
                    readable, _, _ = select.select(list(peers), [], [], 30)
                    data = readable[0].recv(65536) if readable else b""
                    if not data:
                        return
                    peers[readable[0]].sendall(data)

        def accept() -> None:
            while not done.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                client.settimeout(None)
                threading.Thread(target=pipe, args=(client,), daemon=True).start()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=5)
            listener.close()


class SimulatedHost:
    """A host's side of the rollout: it runs the release it was last switched to."""

    def __init__(self, world: World, host: HostSpec) -> None:
        self.world, self.host = world, host

    @property
    def current(self) -> str:
        return self.world.runs.get(self.host.name, "")

    @property
    def conn(self) -> Relay:
        return Relay(self.world.answers["wrong" if self.current == WRONG_B.id else "right"])

    def facts(self, release_id: str = "") -> Facts:
        return Facts(current=self.current, running=bool(self.current), running_release=self.current)

    def stage(self, release: Release, wheel: object) -> bool:
        return True

    def stop(self) -> None:
        pass

    def activate_and_start(self, release_id: str) -> str:
        self.world.runs[self.host.name] = release_id
        return f"started {release_id}"

    def wait_ready(self, timeout_s: float) -> str:
        return "ready"

    def prune(self, keep: int) -> int:
        return 0

    def close(self) -> None:
        pass

    def metrics(self) -> str:
        """100 chat requests more at each scrape; a slow release's all over a second."""
        count = self.world.scrapes[self.host.name] = self.world.scrapes.get(self.host.name, 0) + 1
        served, slow = count * 100, self.current in self.world.slow
        requests, duration = names.HTTP_REQUESTS_METRIC, names.HTTP_DURATION_METRIC
        lines = [f"# TYPE {requests} counter", f'{requests}_total{{route="{ROUTE}",status="200"}} {served}']
        lines.append(f"# TYPE {duration} histogram")
        for le in ("0.5", "1.0", "5.0", "+Inf"):
            within = 0 if slow and le in ("0.5", "1.0") else served
            lines.append(f'{duration}_bucket{{route="{ROUTE}",le="{le}"}} {within}')
        lines += [f'{duration}_count{{route="{ROUTE}"}} {served}', f'{duration}_sum{{route="{ROUTE}"}} 1']
        return "\n".join(lines) + "\n"


class Rotation:
    """The target group's side: which hosts are in rotation."""

    def __init__(self) -> None:
        self.out: set[str] = set()

    def drain(self, host: HostSpec, timeout: float) -> int:
        self.out.add(host.name)
        return 0

    def enable(self, host: HostSpec, timeout: float) -> None:
        self.out.discard(host.name)

    def state(self, host: HostSpec) -> str:
        return "drain" if host.name in self.out else "ready"


@pytest.fixture
def world(monkeypatch) -> Iterator[World]:
    with openai_standin("the sea is wide") as right, openai_standin("the sea is narrow") as wrong:
        state = World(answers={"right": right, "wrong": wrong}, slow={SLOW_B.id})

        class SimulatedHostsRollout(Rollout):
            def __init__(self, settings, pool, hosts, balancer, connect, reporter=None, verification=None):  # noqa: ANN001
                super().__init__(settings, pool, hosts, Rotation(), connect, reporter, verification)

            def session(self, host: HostSpec) -> SimulatedHost:  # type: ignore[override]
                return SimulatedHost(state, host)

        monkeypatch.setattr("frontier.rollout.strategy.Rollout", SimulatedHostsRollout)
        yield state


@pytest.fixture
def backend(prod, saved_outputs, world, tmp_path) -> Ec2Backend:  # noqa: F811
    verify_set = tmp_path / "host-set.yaml"
    verify_set.write_text(SET)
    assert prod.rollout.verify_canary and prod.rollout.gate.max_p99_ratio == 2  # the stack file's
    gate = prod.rollout.gate.model_copy(update={"window_s": 0.2})  # the gate's sleep is real time
    settings = prod.model_copy(
        update={
            "verify": prod.verify.model_copy(update={"file": str(verify_set)}),
            "rollout": prod.rollout.model_copy(update={"gate": gate}),
        }
    )
    bucket = saved_outputs.ec2(settings).history_bucket
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=bucket)
    boto3.client("secretsmanager", region_name=REGION).put_secret_value(  # the runtimes' key
        SecretId=settings.runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
    )
    ec2 = Ec2Backend(settings, settings.only_pool)
    for host in ec2.hosts():
        world.runs[host.name] = RELEASE_A.id  # the group's hosts serve release A
    ec2.history_store().put_release(RELEASE_A)
    return ec2


def test_a_canary_that_answers_like_the_old_release_and_as_fast_rolls_over_every_host(backend, world):
    events = []
    result = backend.roll(FAST_B, "deploy", events.append)
    assert result.outcome == "succeeded", result.reason
    assert any(e.detail == f"golden outputs recorded from {RELEASE_A.id}" for e in events)
    verified = [e for e in events if e.phase == "verify" and e.status == "ok"]
    assert verified and verified[0].detail == "2/2 cases passed (100.0%)"
    assert set(world.runs[h.name] for h in backend.hosts()) == {FAST_B.id}


def test_a_canary_that_answers_wrongly_is_retired_and_the_old_hosts_keep_serving(backend, world):
    old = {h.name for h in backend.hosts()}
    result = backend.roll(WRONG_B, "deploy", None)
    assert result.outcome == "rolled_back"
    assert "verification: pass rate 50.0%" in result.reason and "greedy (golden: " in result.reason
    assert {h.name for h in backend.hosts()} == old
    assert {world.runs[name] for name in old} == {RELEASE_A.id}


def test_a_canary_slower_than_the_old_release_by_more_than_max_p99_ratio_is_retired(backend, world):
    old = {h.name for h in backend.hosts()}
    result = backend.roll(SLOW_B, "deploy", None)
    assert result.outcome == "rolled_back"
    assert "> rollout.gate.max_p99_ratio 2 x the old release's" in result.reason
    assert {h.name for h in backend.hosts()} == old
    assert {world.runs[name] for name in old} == {RELEASE_A.id}
