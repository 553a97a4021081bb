"""An EC2 stack whose ALB fronts its runtimes rolls by traffic share (``rollout.traffic_steps``):
the new release's hosts move into a second target group, and the API's listener rule weighs the
two groups step by step; a failed step puts all the weight back on the main group before the
canary returns to the release it ran.

Real: the EC2 backend's roll and its balancer (:class:`AlbWeightedBalancer`) as the deploy role,
with its documents as ``pulumi up`` grants them, against moto's server enforcing IAM
(``tests/e2e/ec2_actors.py``): the auto scaling group (discovered by its tags, held while it rolls),
the two target groups, the listener rule's weights (``ModifyRule``), the history in S3; the
weighted rollout's algorithm, its gates on each release's series and its revert. Simulated: each
host's side (moto's instances run no sshd and no runtime), by ``test_canary_gates_ec2``'s
:class:`SimulatedHost`, which runs the release it was switched to and answers /metrics as that
release's runtime would; moto reports every registered target healthy at once (no health checks).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from frontier_hostside import names
from frontier_hostside.names import NODE_GROUP_TAG, ROLE_TAG, STACK_TAG
from test_canary_gates_ec2 import ROUTE, SET, SimulatedHost, World

from frontier import project
from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.release import Release
from frontier.rollout.weighted import WeightedRollout
from frontier.targets import load_stack
from frontier.targets.ec2.backend import Ec2Backend
from frontier.targets.ec2.balancer import AlbWeightedBalancer
from tests.e2e import ec2_actors
from tests.openai_standin import API_KEY, openai_standin

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOSTS = 3
STEPS = [25, 50, 100]


def release(note: str) -> Release:
    return Release(Artifact("sha256:" + "a" * 64, "image"), {"runtime.yaml": f"note: {note}\n"})


RELEASE_A, RELEASE_B, FAILING_B = (release(n) for n in ("a", "b", "failing"))


def stack_document(verify_file: str) -> dict[str, Any]:
    """prod, its ALB in front of its runtimes, three hosts rolled by traffic share in place, its
    canary verified with ``verify_file``, a gate window short enough for a test (the gate's sleep is
    real time)."""
    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.prod.yaml").read_text())
    config = document["config"]
    (group,) = config["frontier:node_groups"]
    group.update(min_size=1, desired_size=HOSTS, max_size=HOSTS)
    group.pop("schedule", None)  # its peak floor (8 hosts) needs a larger group
    rollout = config["frontier:rollout"]
    rollout.update(traffic_steps=STEPS, canary_hosts=1, max_surge=0)
    rollout["gate"].update(window_s=0.2, min_requests=1)
    config["frontier:verify"] = {**config.get("frontier:verify", {}), "file": verify_file}
    return document


@dataclass
class Alb:
    """What the ALB did, in order, as the administrator reads it after each of the deploy role's
    calls: the canary group's weight after each ``ModifyRule``, the hosts it would route a request to
    after every change, and each host's switch."""

    admin: Any
    main: str
    canary: str
    rule: str
    timeline: list[tuple[str, Any]] = field(default_factory=list)

    def weights(self) -> dict[str, int]:
        (rule,) = self.admin.describe_rules(RuleArns=[self.rule])["Rules"]
        (forward,) = rule["Actions"]
        return {g["TargetGroupArn"]: g["Weight"] for g in forward["ForwardConfig"]["TargetGroups"]}

    def routable(self) -> set[str]:
        """Healthy targets of a group with a weight above zero."""
        return {
            d["Target"]["Id"]
            for group, weight in self.weights().items()
            if weight > 0
            for d in self.admin.describe_target_health(TargetGroupArn=group)["TargetHealthDescriptions"]
            if d["TargetHealth"]["State"] == "healthy"
        }

    def canary_weights(self) -> list[int]:
        return [value for what, value in self.timeline if what == "canary weight"]


class Watched:
    """The deploy role's elbv2 client, the ALB's state read back after each call that changes it."""

    def __init__(self, client: Any, alb: Alb) -> None:
        self.client, self.alb = client, alb

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.client, name)
        if name not in ("modify_rule", "register_targets", "deregister_targets"):
            return call

        def watched(**kwargs: Any) -> Any:
            reply = call(**kwargs)
            if name == "modify_rule":
                self.alb.timeline.append(("canary weight", self.alb.weights()[self.alb.canary]))
            self.alb.timeline.append(("routable", len(self.alb.routable())))
            return reply

        return watched


@dataclass
class Account:
    backend: Ec2Backend
    world: World
    alb: Alb
    #: Releases whose hosts answer only 500s.
    failing: set[str]

    def runs(self) -> dict[str, str]:
        return {h.name: self.world.runs[h.name] for h in self.backend.hosts()}


def make_resources(prod: ec2_actors.Prod) -> tuple[str, str, str]:
    """What ``pulumi up`` of the stack makes that a rollout touches, as the administrator (infra/edge.py):
    the node group's auto scaling group attached to the main target group, a canary target group on
    the same port, the API's listener rule forwarding all of its weight to the main group; the history
    bucket. The main group's, the canary group's and the rule's ARNs."""
    settings, admin = prod.settings, (lambda service: prod.client("admin", service))
    ec2, autoscaling, elbv2 = admin("ec2"), admin("autoscaling"), admin("elbv2")
    vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{i}.0/24", AvailabilityZone=f"{prod.region}{zone}")[
            "Subnet"
        ]["SubnetId"]
        for i, zone in enumerate("ab", start=1)
    ]
    alb = elbv2.create_load_balancer(Name="prod-edge-alb", Subnets=subnets, Type="application")
    groups = [
        elbv2.create_target_group(Name=name, Protocol="HTTPS", Port=8443, VpcId=vpc, TargetType="instance")[
            "TargetGroups"
        ][0]["TargetGroupArn"]
        for name in ("prod-edge-tg", "prod-edge-canary-tg")
    ]
    listener = elbv2.create_listener(
        LoadBalancerArn=alb["LoadBalancers"][0]["LoadBalancerArn"],
        Protocol="HTTP",
        Port=80,
        DefaultActions=[
            {
                "Type": "fixed-response",
                "FixedResponseConfig": {"StatusCode": "404", "ContentType": "text/plain"},
            }
        ],
    )["Listeners"][0]["ListenerArn"]
    rule = elbv2.create_rule(
        ListenerArn=listener,
        Priority=100,
        Conditions=[{"Field": "path-pattern", "PathPatternConfig": {"Values": ["/v1/*"]}}],
        Actions=[
            {
                "Type": "forward",
                "ForwardConfig": {
                    "TargetGroups": [
                        {"TargetGroupArn": groups[0], "Weight": 100},
                        {"TargetGroupArn": groups[1], "Weight": 0},
                    ]
                },
            }
        ],
    )["Rules"][0]["RuleArn"]
    group = settings.serving_group
    tags = {STACK_TAG: settings.stack, NODE_GROUP_TAG: group.name, ROLE_TAG: "runtime", "Name": "prod-h100"}
    ec2_actors.tagged_group(ec2, autoscaling, ec2_actors.NODE_GROUP_ASG, subnets[0], (1, HOSTS, HOSTS), tags)
    instances = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[ec2_actors.NODE_GROUP_ASG])[
        "AutoScalingGroups"
    ][0]["Instances"]
    # The group's hosts in the main target group, as infra/nodes.py attaches it.
    elbv2.register_targets(TargetGroupArn=groups[0], Targets=[{"Id": i["InstanceId"]} for i in instances])
    bucket = ec2_actors.outputs(settings, groups[0]).history_bucket
    where = (
        {}
        if prod.region == "us-east-1"
        else {"CreateBucketConfiguration": {"LocationConstraint": prod.region}}
    )
    admin("s3").create_bucket(Bucket=bucket, **where)
    # The runtimes' key: a deploy reads it to verify its canary (rollout.verify_canary, on for prod).
    admin("secretsmanager").create_secret(
        Name=settings.pools[0].runtime.api_keys_secret, SecretString=json.dumps({"keys": [API_KEY]})
    )
    return groups[0], groups[1], rule


@pytest.fixture
def account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    """prod's account in moto's enforcing server as its deploy role sees it, every host on release A."""
    verify_set = tmp_path / "host-set.yaml"
    verify_set.write_text(SET)
    path = tmp_path / "stacks" / "Pulumi.prod.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(stack_document(str(verify_set)), sort_keys=False))
    settings = load_stack("prod", path=path)
    with (
        openai_standin("the sea is wide") as right,
        openai_standin("the sea is narrow") as wrong,
        ec2_actors.enforcing_moto(tmp_path, settings.region, {}) as server,
    ):
        keys = ec2_actors.admin_key(settings, server.endpoint, settings.region)
        prod = ec2_actors.Prod(
            settings, server.endpoint, keys, ec2_actors.outputs(settings, ""), tmp_path, settings.region
        )
        main, canary, rule = make_resources(prod)
        prod.saved = ec2_actors.outputs(settings, main).model_copy(
            update={"canary_target_group_arn": canary, "api_rule_arn": rule}
        )
        saved_file = tmp_path / "outputs.json"
        saved_file.write_text(prod.saved.model_dump_json())
        monkeypatch.setenv("FRONTIER_STACK_OUTPUTS", str(saved_file))
        ec2_actors.add_users(prod)
        ec2_actors.as_actor(prod, "deploy", monkeypatch)
        alb = Alb(prod.client("admin", "elbv2"), main, canary, rule)
        world, failing = World(answers={"right": right, "wrong": wrong}), set[str]()

        class Host(SimulatedHost):
            def activate_and_start(self, release_id: str) -> str:
                alb.timeline.append(("switch", (self.host.name, release_id)))
                return super().activate_and_start(release_id)

            def metrics(self) -> str:
                if self.current not in failing:
                    return super().metrics()
                count = self.world.scrapes[self.host.name] = self.world.scrapes.get(self.host.name, 0) + 1
                requests = names.HTTP_REQUESTS_METRIC
                return f'# TYPE {requests} counter\n{requests}_total{{route="{ROUTE}",status="500"}} {count * 100}\n'

        class SimulatedHostsRollout(WeightedRollout):
            """The weighted rollout with the backend's real balancer; each host's side simulated."""

            def session(self, host: HostSpec) -> SimulatedHost:  # type: ignore[override]
                return Host(world, host)

        monkeypatch.setattr("frontier.rollout.strategy.WeightedRollout", SimulatedHostsRollout)
        real: Callable[[Ec2Backend, str], Any] = Ec2Backend.aws_client
        monkeypatch.setattr(
            Ec2Backend,
            "aws_client",
            lambda self, service: (
                Watched(real(self, service), alb) if service == "elbv2" else real(self, service)
            ),
        )
        backend = Ec2Backend(settings, settings.only_pool)
        for host in backend.hosts():
            world.runs[host.name] = RELEASE_A.id
        backend.history_store().put_release(RELEASE_A)
        yield Account(backend, world, alb, failing)


def test_the_backend_weighs_two_target_groups_where_the_stack_rolls_by_traffic_share(account):
    assert isinstance(account.backend.balancer(), AlbWeightedBalancer)


def test_a_deploy_sets_the_rules_weights_through_each_step_and_back_to_the_main_group(account):
    result = account.backend.roll(RELEASE_B, "deploy", None)
    assert result.outcome == "succeeded", result.reason
    # 0 while the canary switches, then each step, then all of it back on the main group.
    assert account.alb.canary_weights() == [0, *STEPS, 0]
    assert [(step.percent, step.outcome) for step in result.steps] == [(p, "passed") for p in STEPS]
    assert set(account.runs().values()) == {RELEASE_B.id}
    assert account.alb.weights() == {account.alb.main: 100, account.alb.canary: 0}
    health = account.alb.admin.describe_target_health(TargetGroupArn=account.alb.canary)
    assert health["TargetHealthDescriptions"] == []  # every host back in the main group
    main = account.alb.admin.describe_target_health(TargetGroupArn=account.alb.main)
    assert {d["Target"]["Id"] for d in main["TargetHealthDescriptions"]} == {
        h.instance_id for h in account.backend.hosts()
    }


def test_at_least_one_replica_is_routable_after_every_change_to_the_alb(account):
    result = account.backend.roll(RELEASE_B, "deploy", None)
    assert result.outcome == "succeeded", result.reason
    routable = [value for what, value in account.alb.timeline if what == "routable"]
    assert routable and min(routable) >= 1
    assert all(step.routable >= 1 for step in result.steps)


def test_a_failed_step_puts_the_weight_back_on_the_main_group_before_the_canary_is_restored(account):
    account.failing.add(FAILING_B.id)
    result = account.backend.roll(FAILING_B, "deploy", None)
    assert result.outcome == "rolled_back"
    assert result.reason.startswith("traffic step 25 %: ")
    timeline = account.alb.timeline
    (canary, _), (back, _) = (event for what, event in timeline if what == "switch")
    assert canary == back
    restored = timeline.index(("switch", (canary, RELEASE_A.id)))
    weights_before = [value for what, value in timeline[:restored] if what == "canary weight"]
    assert weights_before == [0, 25, 0]  # the revert's first move: no weight on the canary
    assert min(value for what, value in timeline if what == "routable") >= 1
    assert set(account.runs().values()) == {RELEASE_A.id}
    assert account.alb.weights() == {account.alb.main: 100, account.alb.canary: 0}
