"""A warned spot host leaves the ALB's target groups at once: the function EventBridge invokes with
the two-minute warning (``infra/functions/out_of_service.py``) deregisters the instance from the
stack's groups that hold it, as the role ``pulumi up`` gives it.

Real: the function's archive, run by a fresh interpreter with nothing but its own file and boto3 (as
Lambda's Python runtime has), its role's document as the program renders it, moto's server enforcing
IAM in a process of its own, its target groups and instances. Simulated: EventBridge's delivery
(the event is handed to the handler as EventBridge would hand it) and Lambda's start, neither of
which runs here. moto checks ELB calls against ``*`` (``frontier.targets.local.iam``), so the
document's scope to the stack's groups is shown by iam-simulate under mocks
(tests/infra/test_spot_out_of_service_program.py); here moto holds the function to its actions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from frontier.targets import load_stack
from frontier.targets.local import iam
from infra.functions import out_of_service as oos
from infra.interruptions import REBALANCE_RECOMMENDATION
from infra.out_of_service import FUNCTION_FILES, out_of_service_policy
from tests.e2e import ec2_actors

pytestmark = pytest.mark.e2e

REGION = "us-east-1"
LOG_GROUP = f"arn:aws:logs:{REGION}:{iam.ACCOUNT_ID}:log-group:/aws/lambda/frontier-prod-out-of-service"


@dataclass
class Account:
    endpoint: str
    admin: dict[str, str]
    function: dict[str, str]  # the function role's credentials
    main: str  # the API's target group
    canary: str  # the canary group of a rollout by traffic share
    foreign: str  # another stack's group
    instances: list[str]

    def client(self, who: dict[str, str]):  # noqa: ANN201
        return boto3.client("elbv2", endpoint_url=self.endpoint, region_name=REGION, **who)

    def held(self, group: str) -> dict[str, str]:
        """Instance → state, of the targets ``group`` holds (as the administrator sees them)."""
        found = self.client(self.admin).describe_target_health(TargetGroupArn=group)
        return {d["Target"]["Id"]: d["TargetHealth"]["State"] for d in found["TargetHealthDescriptions"]}


def _keys(made: dict) -> dict[str, str]:
    return {"aws_access_key_id": made["AccessKeyId"], "aws_secret_access_key": made["SecretAccessKey"]}


@pytest.fixture
def account(tmp_path: Path) -> Iterator[Account]:
    """prod's ALB groups with three spot hosts in them, and the function's role as a user."""
    settings = load_stack("prod")
    with ec2_actors.enforcing_moto(tmp_path, REGION, {}) as server:
        admin_key = ec2_actors.admin_key(settings, server.endpoint, REGION)["admin"]
        admin = {"aws_access_key_id": admin_key.key_id, "aws_secret_access_key": admin_key.secret}
        ec2 = boto3.client("ec2", endpoint_url=server.endpoint, region_name=REGION, **admin)
        elb = boto3.client("elbv2", endpoint_url=server.endpoint, region_name=REGION, **admin)
        vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24", AvailabilityZone=f"{REGION}a")
        instances = [
            i["InstanceId"]
            for i in ec2.run_instances(
                ImageId="ami-0123456789abcdef0", MinCount=3, MaxCount=3, SubnetId=subnet["Subnet"]["SubnetId"]
            )["Instances"]
        ]
        groups = [
            elb.create_target_group(Name=name, Protocol="HTTPS", Port=8443, VpcId=vpc, TargetType="instance")[
                "TargetGroups"
            ][0]["TargetGroupArn"]
            for name in ("prod-tg", "prod-canary-tg", "staging-tg")
        ]
        main, canary, foreign = groups
        a, b, c = instances
        # As auto scaling registers a group's hosts: by instance, on the group's own port.
        elb.register_targets(TargetGroupArn=main, Targets=[{"Id": a}, {"Id": b}])
        elb.register_targets(TargetGroupArn=canary, Targets=[{"Id": c}])
        elb.register_targets(TargetGroupArn=foreign, Targets=[{"Id": a}])
        users = boto3.client("iam", endpoint_url=server.endpoint, region_name=REGION, **admin)
        users.create_user(UserName="frontier-prod-out-of-service")
        document = json.loads(out_of_service_policy([main, canary], LOG_GROUP))
        users.put_user_policy(
            UserName="frontier-prod-out-of-service",
            PolicyName="out-of-service",
            PolicyDocument=json.dumps(iam.for_moto(document)),
        )
        function = _keys(users.create_access_key(UserName="frontier-prod-out-of-service")["AccessKey"])
        yield Account(server.endpoint, admin, function, main, canary, foreign, instances)


def invoke(account: Account, event: dict, archive: Path) -> dict:
    """The handler of the function's archive, in a fresh interpreter with the function's credentials
    and environment, given ``event`` as EventBridge gives it."""
    for path, source in FUNCTION_FILES.items():
        (archive / path).write_bytes(source.read_bytes())
    env = {
        "PATH": os.environ["PATH"],
        "AWS_ENDPOINT_URL": account.endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": account.function["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": account.function["aws_secret_access_key"],
        oos.TARGET_GROUPS_ENV: f"{account.main},{account.canary}",
    }
    run = "import json, sys; sys.path.insert(0, '.'); import out_of_service as f; print(json.dumps(f.handler(json.load(sys.stdin))))"
    done = subprocess.run(
        [sys.executable, "-I", "-c", run],
        input=json.dumps(event),
        cwd=archive,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def warning(detail_type: str, instance: str) -> dict:
    """An event as EventBridge delivers EC2's notice (the EC2 user guide's example's fields)."""
    return {
        "version": "0",
        "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": iam.ACCOUNT_ID,
        "time": "2026-12-07T12:00:00Z",
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}a:instance/{instance}"],
        "detail": {"instance-id": instance, "instance-action": "terminate"},
    }


def test_a_warned_host_leaves_the_stacks_groups_and_the_others_stay(account, tmp_path):
    a, b, c = account.instances
    started = time.monotonic()
    answer = invoke(account, warning(oos.SPOT_WARNING, a), tmp_path)
    took = time.monotonic() - started
    print(f"\nwarned host out of its target group {took:.2f} s after the function got the warning")
    assert answer == {"instance": a, "deregistered": [account.main]}
    assert a not in account.held(account.main) or account.held(account.main)[a] == "draining"
    assert account.held(account.main)[b] != "draining"
    assert account.held(account.canary) == {c: account.held(account.canary)[c]}
    # Another stack's group is not the function's to touch, even where it holds the warned host.
    assert a in account.held(account.foreign)
    assert took < 5


def test_a_warned_canary_host_leaves_the_canary_group(account, tmp_path):
    c = account.instances[2]
    assert invoke(account, warning(oos.SPOT_WARNING, c), tmp_path)["deregistered"] == [account.canary]
    assert c not in account.held(account.canary) or account.held(account.canary)[c] == "draining"


def test_a_rebalance_recommendation_moves_no_host(account, tmp_path):
    before = {g: account.held(g) for g in (account.main, account.canary)}
    answer = invoke(account, warning(REBALANCE_RECOMMENDATION, account.instances[0]), tmp_path)
    assert answer == {"instance": None, "deregistered": []}
    assert {g: account.held(g) for g in (account.main, account.canary)} == before


def test_a_host_the_stacks_groups_do_not_hold_is_left_alone(account, tmp_path):
    before = {g: account.held(g) for g in (account.main, account.canary, account.foreign)}
    answer = invoke(account, warning(oos.SPOT_WARNING, "i-0fffffffffffffff0"), tmp_path)
    assert answer == {"instance": "i-0fffffffffffffff0", "deregistered": []}
    assert {g: account.held(g) for g in (account.main, account.canary, account.foreign)} == before


def test_the_functions_role_may_take_hosts_out_but_never_put_one_in(account):
    elb = account.client(account.function)
    with pytest.raises(ClientError) as refused:
        elb.register_targets(TargetGroupArn=account.main, Targets=[{"Id": account.instances[2]}])
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
