"""``fab deploy`` and ``fab rollback`` of a disaggregated pool on EC2: the prefill group rolls first,
then the decode group, each through its canary and gates; a decode that fails puts the prefill group
back too, so the pair never stays on two releases; a pool without disaggregation rolls as before.

The stack is dev behind its gateway with its model disaggregated: the prefill half on a group of its
own (``prefill``), the decode half on dev's ``a10g``, two hosts each. Everything runs as the deploy
role (its documents as ``pulumi up`` grants them) against moto's server enforcing IAM
(``tests/e2e/ec2_actors.py``): ``deploy``/``rollback`` as ``fab`` runs them, the history, the lock
and the deploy pointer in S3, both auto scaling groups (discovered by their tags, held while they
roll), and the ALB's target group, which fronts the gateway's own group: no runtime host is ever
drained from it or enabled in it, each is drained by its runtime's own drain through its host's
agent (:class:`~frontier.hosts.gateway_fronted.GatewayFronted`). Simulated: each host's side
(moto's instances have no sshd and no runtime), by ``test_canary_gates_ec2``'s :class:`SimulatedHost`
with a log of every switch and every stop it makes, and the SSH connections the canaries'
verification tunnels through; the runtimes' answers are stand-ins on real sockets (tests/openai_standin.py), a prefill's
naming the blocks it leased in ``kv_transfer_params``, a decode's noting what it was handed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from frontier_hostside import names
from frontier_hostside.agent import Facts
from frontier_hostside.names import NODE_GROUP_TAG, ROLE_TAG, STACK_TAG
from test_canary_gates_ec2 import SET, Relay, SimulatedHost, World

from frontier.config.schema import Settings
from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore
from frontier.release.signing import create_release_key
from frontier.rollout.deploy import deploy, rollback
from frontier.rollout.rolling import Event, Rollout, RolloutFailed
from frontier.targets import load_stack
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.ec2.group import FleetError
from tests.e2e import ec2_actors
from tests.gateway.stacks import dev_gateway_document
from tests.openai_standin import API_KEY, openai_standin

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PREFILL, DECODE = "prefill", "a10g"
HOSTS = 2  # in each group
DIGEST_A, DIGEST_B, BAD = ("sha256:" + c * 64 for c in "abe")
ROUTE = "/v1/chat/completions"


def stack_document(*, disaggregated: bool = True, verify_file: str = "", surge: bool = False) -> dict:
    """dev behind its gateway, its model's prefill half on a group of its own when ``disaggregated``;
    a gate window short enough for a test (the gate's sleep is real time), and so the gateway's probe
    round an enable waits out; with ``surge``, room in each group for one host above its desired
    size, and a rollout that takes it."""
    doc = dev_gateway_document(probe={"interval_s": 0.05, "timeout_s": 0.05})
    config = doc["config"]
    (group,) = config["frontier:node_groups"]
    group.update(min_size=1, desired_size=HOSTS, max_size=HOSTS + int(surge))
    rollout = config["frontier:rollout"]
    rollout["max_surge"] = int(surge)
    rollout["gate"]["window_s"] = 0.2
    rollout["verify_canary"] = bool(verify_file)
    if verify_file:
        config["frontier:verify"] = {**config.get("frontier:verify", {}), "file": verify_file}
    if disaggregated:
        config["frontier:node_groups"] = [group, {**copy.deepcopy(group), "name": PREFILL}]
        config["frontier:runtime"]["prefix_caching"] = True
        config["frontier:disaggregation"] = {
            "prefill": {"node_group": PREFILL, "replicas": HOSTS},
            "decode": {"node_group": DECODE, "replicas": HOSTS},
        }
    return doc


@dataclass
class Switches:
    """Every switch of a host's runtime, in order: (its node group, the release it started)."""

    made: list[tuple[str, str]] = field(default_factory=list)
    #: Every stop of a host's runtime, by host name, in order.
    stops: list[str] = field(default_factory=list)

    def groups_to(self, release: str) -> list[str]:
        """The groups whose hosts switched to ``release``, in the order they did, one entry a run."""
        order: list[str] = []
        for group, rid in self.made:
            if rid == release and (not order or order[-1] != group):
                order.append(group)
        return order


class PairHost(SimulatedHost):
    """A simulated host that logs each switch, serves only 500s where its group and the digest it
    runs are one of ``failing`` (a half that cannot take the release), and whose SSH connection
    reaches its half's runtime stand-in."""

    switches: Switches
    failing: set[tuple[str, str]]
    digest_of: Callable[[str], str]

    #: Where each half's runtime answers: "prefill", "mute prefill" (one that hands over nothing), "decode".
    pair: dict[str, tuple[str, int]]
    #: Digests whose prefill hosts answer but lease no blocks (a prefill that does not speak the protocol).
    mute: set[str]

    @property
    def conn(self) -> Relay:
        if self.host.group == DECODE:
            return Relay(self.pair["decode"])
        return Relay(self.pair["mute prefill" if self.digest_of(self.current) in self.mute else "prefill"])

    def activate_and_start(self, release_id: str) -> str:
        self.switches.made.append((self.host.group, release_id))
        return super().activate_and_start(release_id)

    def stop(self) -> str:
        self.switches.stops.append(self.host.name)
        return "terminated"

    def status(self) -> Facts:
        """What the agent's ``status`` reads: a host that runs a release answers ready."""
        running = bool(self.current)
        return Facts(current=self.current, running=running, running_release=self.current, ready=running)

    def metrics(self) -> str:
        if (self.host.group, self.digest_of(self.current)) not in self.failing:
            return super().metrics()
        count = self.world.scrapes[self.host.name] = self.world.scrapes.get(self.host.name, 0) + 1
        requests = names.HTTP_REQUESTS_METRIC
        return f'# TYPE {requests} counter\n{requests}_total{{route="{ROUTE}",status="500"}} {count * 100}\n'


@contextlib.contextmanager
def pair_runtime(
    role: str, answers: tuple[str, int], handed: list[dict | None], *, leases: bool = True
) -> Iterator[tuple[str, int]]:
    """A disaggregated half's runtime on a free loopback port: it answers as the runtime at
    ``answers`` does; a prefill asked with ``do_remote_decode`` adds where its blocks wait (unless
    it ``leases`` none), a decode notes in ``handed`` the ``kv_transfer_params`` each request brought."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            params = request.pop("kv_transfer_params", None)
            if role == "decode":
                handed.append(params)
            answer = httpx.post(
                f"http://{answers[0]}:{answers[1]}{self.path}",
                json=request,
                headers={"Authorization": self.headers.get("Authorization", "")},
            )
            body = answer.json()
            if role == "prefill" and params and params.get("do_remote_decode") and leases:
                body["kv_transfer_params"] = {
                    "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "prefill-0",
                    "remote_host": "ip-10-20-1-7", "remote_port": 5600, "remote_block_ids": [3, 4],
                    "remote_request_id": "r-1",
                }  # fmt: skip
            data = json.dumps(body).encode()
            self.send_response(answer.status_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Account:
    """dev's account in moto's enforcing server, as its deploy role sees it."""

    settings: Settings
    backend: Ec2Backend
    store: HistoryStore
    world: World
    switches: Switches
    #: (node group, digest): the hosts of that group serve only 500s on that digest.
    failing: set[tuple[str, str]]
    #: Digests whose prefill hosts lease no blocks.
    mute: set[str]
    #: The kv_transfer_params each request to a decode runtime brought (None: none).
    handed: list[dict | None]
    #: A client of moto's server as the administrator (standing in for `pulumi up` and the console).
    admin: Callable[[str], Any]

    def runs(self, group: str) -> set[str]:
        """The digests the hosts of ``group`` run now."""
        return {self.store.get_release(self.world.runs[h.name]).digest for h in self.backend.hosts(group)}


GATEWAY_GROUP = "dev-gateway-asg"


def make_groups(prod: ec2_actors.Prod) -> str:
    """What ``pulumi up`` makes that a rollout touches, as the administrator: each node group's
    auto scaling group tagged for discovery, the gateway's group and the ALB's target group it is
    attached to (infra/ec2_program.py attaches no runtime group where a gateway fronts the pools),
    the history bucket, the runtimes' key; the target group's ARN."""
    settings, admin = prod.settings, (lambda service: prod.client("admin", service))
    ec2, autoscaling = admin("ec2"), admin("autoscaling")
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone=f"{prod.region}a")[
        "Subnet"
    ]["SubnetId"]
    assert settings.gateway is not None
    target_group = admin("elbv2").create_target_group(
        Name="dev-tg", Protocol="HTTP", Port=settings.gateway.port, VpcId=vpc, TargetType="instance"
    )["TargetGroups"][0]["TargetGroupArn"]
    gateway_tags = {STACK_TAG: settings.stack, ROLE_TAG: "gateway", "Name": "dev-gateway"}
    ec2_actors.tagged_group(ec2, autoscaling, GATEWAY_GROUP, subnet, (1, 1, 1), gateway_tags)
    autoscaling.attach_load_balancer_target_groups(
        AutoScalingGroupName=GATEWAY_GROUP, TargetGroupARNs=[target_group]
    )
    for group in settings.node_groups:
        tags = {
            STACK_TAG: settings.stack,
            NODE_GROUP_TAG: group.name,
            ROLE_TAG: "runtime",
            "Name": f"dev-{group.name}",
        }
        sizes = (group.min_size, group.desired_size, group.max_size)
        ec2_actors.tagged_group(ec2, autoscaling, f"dev-{group.name}-asg", subnet, sizes, tags)
    admin("s3").create_bucket(
        Bucket=ec2_actors.outputs(settings, target_group).history_bucket,
        CreateBucketConfiguration={"LocationConstraint": prod.region},
    )
    admin("secretsmanager").create_secret(
        Name=settings.pools[0].runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
    )
    return target_group


@pytest.fixture
def account_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """``account_of(disaggregated=..., verify=..., surge=...)``: dev's account with its groups and the deploy
    role's user, the environment the deploy role's ``fab`` runs in, and hosts that run nothing yet."""
    handed: list[dict | None] = []
    with (
        openai_standin("the sea is wide") as right,
        openai_standin("the sea is narrow") as wrong,
        pair_runtime("prefill", right, handed) as prefill,
        pair_runtime("prefill", right, handed, leases=False) as mute_prefill,
        pair_runtime("decode", right, handed) as decode,
        ec2_actors.enforcing_moto(tmp_path, "us-west-2", {}) as server,
    ):

        def make(*, disaggregated: bool = True, verify: bool = False, surge: bool = False) -> Account:
            verify_file = ""
            if verify:
                verify_set = tmp_path / "host-set.yaml"
                verify_set.write_text(SET)
                verify_file = str(verify_set)
            path = tmp_path / "stacks" / "Pulumi.dev.yaml"
            path.parent.mkdir(exist_ok=True)
            document = stack_document(disaggregated=disaggregated, verify_file=verify_file, surge=surge)
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            settings = load_stack("dev", path=path)
            region = settings.region
            keys = ec2_actors.admin_key(settings, server.endpoint, region)
            prod = ec2_actors.Prod(
                settings, server.endpoint, keys, ec2_actors.outputs(settings, ""), tmp_path, region
            )
            prod.saved = ec2_actors.outputs(settings, make_groups(prod))
            # The stack's release key (the Foundation's): the deploy role signs each release with it.
            prod.release_key_arn = create_release_key(prod.client("admin", "kms"), settings.stack).arn
            saved_file = tmp_path / "outputs.json"
            saved_file.write_text(prod.saved.model_dump_json())
            monkeypatch.setenv("FRONTIER_STACK_OUTPUTS", str(saved_file))
            ec2_actors.add_users(prod)
            ec2_actors.as_actor(prod, "deploy", monkeypatch)
            world = World(answers={"right": right, "wrong": wrong})
            switches, failing = Switches(), set()
            backend = Ec2Backend(settings, settings.only_pool)
            store = backend.history_store()

            class Host(PairHost):
                pass

            mute: set[str] = set()
            Host.switches, Host.failing, Host.mute = switches, failing, mute
            Host.pair = {"prefill": prefill, "mute prefill": mute_prefill, "decode": decode}
            Host.digest_of = staticmethod(lambda rid: store.get_release(rid).digest if rid else "")
            # The SSH connection a verification tunnels through to a host's runtime port, and the
            # host's agent the balancer drains and enables a runtime through.
            monkeypatch.setattr(Ec2Backend, "connect", lambda self, host: Host(world, host).conn)
            monkeypatch.setattr(Ec2Backend, "session", lambda self, host: Host(world, host))

            class SimulatedHostsRollout(Rollout):
                """The rollout with its real balancer (the gateway-fronted one the backend gives)."""

                def session(self, host: HostSpec) -> SimulatedHost:  # type: ignore[override]
                    return Host(world, host)

            monkeypatch.setattr("frontier.rollout.strategy.Rollout", SimulatedHostsRollout)
            for digest in (DIGEST_A, DIGEST_B, BAD):
                store.put_artifact(
                    Artifact(digest, "image", image=f"{settings.image_repository}@{digest}"), None
                )
            return Account(
                settings,
                backend,
                store,
                world,
                switches,
                failing,
                mute,
                handed,
                lambda service: prod.client("admin", service),
            )

        yield make


def test_a_deploy_rolls_the_prefill_group_before_the_decode_group_and_both_end_on_the_new_digest(account_of):
    account = account_of()
    deploy(account.backend, DIGEST_A)
    events: list[Event] = []
    result = deploy(account.backend, DIGEST_B, reporter=events.append)
    assert result.outcome == "succeeded", result.reason
    assert account.switches.groups_to(result.release) == [PREFILL, DECODE]
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_B}
    # Each half through its own canary and gate: the prefill's two waves, then the decode's.
    groups = {h.name: h.group for h in account.backend.hosts()}
    waves = [(groups[e.host], e.phase) for e in events if e.phase in ("canary", "batch 1")]
    assert waves == [(PREFILL, "canary"), (PREFILL, "batch 1"), (DECODE, "canary"), (DECODE, "batch 1")]
    gated = [e.host for e in events if e.phase == "gate" and e.status == "ok" and "requests" in e.detail]
    assert [groups[name] for name in gated] == [PREFILL, PREFILL, DECODE, DECODE]
    assert (
        result.strategy.startswith(f"prefill {PREFILL}: one-unavailable")
        and f"; decode {DECODE}: " in result.strategy
    )


def test_a_decode_canary_that_fails_leaves_both_halves_on_the_old_digest_and_the_history_says_why(account_of):
    account = account_of()
    old = deploy(account.backend, DIGEST_A).release
    account.failing.add((DECODE, BAD))  # e.g. a decode that cannot pull from the new prefill
    with pytest.raises(RolloutFailed) as failed:
        deploy(account.backend, BAD)
    bad = failed.value.result.release
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_A}
    # The prefill went first, the decode's canary failed and went back, then the prefill went back.
    assert [(group, rid) for group, rid in account.switches.made if rid in (bad, old)][2 * HOSTS :] == [
        (PREFILL, bad), (PREFILL, bad), (DECODE, bad), (DECODE, old), (PREFILL, old), (PREFILL, old),
    ]  # fmt: skip
    record = account.store.records()[-1]
    assert (record["release"], record["outcome"]) == (bad, "rolled_back")
    assert record["reason"].startswith(f"decode group '{DECODE}': dev-{DECODE}-")
    assert ": gate failed: error rate 100.00% > rollout.gate.max_error_rate" in record["reason"]
    assert record["reason"].endswith(f"; the prefill group '{PREFILL}' was put back to {old}")
    assert account.store.last_good()["release"] == old


def test_a_prefill_canary_that_fails_leaves_the_decode_group_untouched(account_of):
    account = account_of()
    deploy(account.backend, DIGEST_A)
    account.failing.add((PREFILL, DIGEST_B))
    before = len(account.switches.made)
    with pytest.raises(RolloutFailed) as failed:
        deploy(account.backend, DIGEST_B)
    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert result.reason.startswith(f"prefill group '{PREFILL}': dev-{PREFILL}-")
    assert ": gate failed: error rate 100.00% > rollout.gate.max_error_rate" in result.reason
    assert result.reason.endswith("; the decode group was not touched")
    assert [group for group, _ in account.switches.made[before:]] == [PREFILL, PREFILL]  # there and back
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_A}


def test_a_pool_whose_decode_group_cannot_be_found_rolls_neither_half(account_of):
    account = account_of()
    deploy(account.backend, DIGEST_A)
    before = len(account.switches.made)
    # The decode group's auto scaling group no longer carries the tag fab finds it by.
    account.admin("autoscaling").delete_tags(
        Tags=[
            {"ResourceId": f"dev-{DECODE}-asg", "ResourceType": "auto-scaling-group", "Key": NODE_GROUP_TAG}
        ]
    )
    with pytest.raises(FleetError, match=f"no auto scaling group tagged .*{NODE_GROUP_TAG}={DECODE}"):
        deploy(account.backend, DIGEST_B)
    assert account.switches.made[before:] == []
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_A}


def test_under_surge_a_failing_decode_retires_its_new_host_and_the_prefill_surges_back(account_of):
    account = account_of(surge=True)
    deploy(account.backend, DIGEST_A)
    account.failing.add((DECODE, BAD))
    with pytest.raises(RolloutFailed) as failed:
        deploy(account.backend, BAD)
    result = failed.value.result
    assert result.strategy.startswith(f"prefill {PREFILL}: surge: +1 host(s) first")
    assert f"; decode {DECODE}: surge: +1 host(s) first" in result.strategy
    assert result.reason.endswith(
        f"the prefill group '{PREFILL}' was put back to {account.store.last_good()['release']}"
    )
    # Every host each group serves with runs the old digest, and each group is back at its size.
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_A}
    for group in (PREFILL, DECODE):
        fleet = account.backend.fleet(group)
        assert fleet is not None and fleet.size().desired == HOSTS
        assert len(account.backend.hosts(group)) == HOSTS


def test_a_rollback_returns_both_halves_to_the_previous_release_prefill_first(account_of):
    account = account_of()
    first = deploy(account.backend, DIGEST_A).release
    deploy(account.backend, DIGEST_B)
    result = rollback(account.backend)
    assert (result.kind, result.release, result.outcome) == ("rollback", first, "succeeded")
    assert account.switches.groups_to(first)[-2:] == [PREFILL, DECODE]
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_A}


def test_the_decode_canary_answers_through_a_new_prefill_held_to_one_recording_of_the_old_release(
    account_of,
):
    account = account_of(verify=True)
    old = deploy(account.backend, DIGEST_A).release  # over hosts that ran nothing: nothing recorded
    account.handed.clear()
    events: list[Event] = []
    new = deploy(account.backend, DIGEST_B, reporter=events.append).release
    groups = {h.name: h.group for h in account.backend.hosts()}
    recorded = [e for e in events if e.phase == "verify" and "golden outputs recorded" in e.detail]
    assert [(groups[e.host], e.detail) for e in recorded] == [
        (PREFILL, f"golden outputs recorded from {old}")
    ]
    passed = [groups[e.host] for e in events if e.phase == "verify" and e.status == "ok"]
    assert passed == [PREFILL, DECODE]
    [through] = [e for e in events if "the decode's canary answers through" in e.detail]
    assert groups[through.host] == PREFILL and account.world.runs[through.host] == new
    # Every case the decode hosts answered (the canary, and the old host it is judged against)
    # came with the blocks the prefill leased: the pair answered together.
    assert account.handed and all(p and p["do_remote_prefill"] for p in account.handed)
    assert account.store.last_good()["digest"] == DIGEST_B


def test_a_prefill_that_hands_over_nothing_fails_the_decode_canary_and_both_halves_go_back(account_of):
    account = account_of(verify=True)
    deploy(account.backend, DIGEST_A)
    deploy(account.backend, DIGEST_B)
    account.mute.add(BAD)  # its prefill answers every prompt alone, and leases no blocks
    with pytest.raises(RolloutFailed) as failed:
        deploy(account.backend, BAD)
    result = failed.value.result
    assert result.outcome == "rolled_back"
    assert result.reason.startswith(f"decode group '{DECODE}': dev-{DECODE}-")
    assert "verification: pass rate 0.0% < verify.min_pass_rate" in result.reason
    assert "the pair did not answer together: the prefill hop answered no kv_transfer_params" in result.reason
    assert account.runs(PREFILL) == account.runs(DECODE) == {DIGEST_B}


def test_a_pool_without_disaggregation_rolls_its_one_group_as_before(account_of):
    account = account_of(disaggregated=False)
    result = deploy(account.backend, DIGEST_A)
    assert result.outcome == "succeeded"
    assert result.strategy == "one-unavailable: 1 host(s) out of service at a time (rollout.max_surge is 0)"
    assert {group for group, _ in account.switches.made} == {DECODE}
    assert account.runs(DECODE) == {DIGEST_A}


def test_a_deploy_behind_the_gateway_never_registers_a_runtime_host_in_the_target_group(account_of):
    account = account_of(surge=True)
    deploy(account.backend, DIGEST_A)
    result = deploy(account.backend, DIGEST_B)
    assert result.outcome == "succeeded", result.reason
    assert result.strategy.startswith(f"prefill {PREFILL}: surge: +1 host(s) first")
    elbv2, autoscaling = account.admin("elbv2"), account.admin("autoscaling")
    health = elbv2.describe_target_health(TargetGroupArn=account.backend.outputs().target_group_arn)
    targets = {d["Target"]["Id"] for d in health["TargetHealthDescriptions"]}
    (gateway,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GATEWAY_GROUP])[
        "AutoScalingGroups"
    ]
    assert targets == {i["InstanceId"] for i in gateway["Instances"]} != set()
    assert not targets & {h.instance_id for h in account.backend.hosts()}


def test_each_runtime_is_drained_by_its_own_drain_through_its_agent_and_no_session_is_left_open(
    account_of,
):
    account = account_of(disaggregated=False)
    deploy(account.backend, DIGEST_A)
    account.switches.stops.clear()
    events: list[Event] = []
    result = deploy(account.backend, DIGEST_B, reporter=events.append)
    assert result.outcome == "succeeded", result.reason
    hosts = [h.name for h in account.backend.hosts()]
    # The balancer's drain stops each runtime, then the rollout's stop phase finds it stopped.
    assert sorted(set(account.switches.stops)) == sorted(hosts)
    drains = [e for e in events if e.phase == "drain"]
    assert [e.host for e in drains if e.status == "ok"] == hosts
    assert [e for e in drains if e.status == "info"] == []  # no "session(s) still open"
    assert account.runs(DECODE) == {DIGEST_B}
