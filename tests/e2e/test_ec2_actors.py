"""The EC2 stack's paths, each run by its actor against moto's server enforcing the prod stack's
documents (``tests/e2e/ec2_actors.py``), then evaluated as AWS would (``iam_simulation``): the
deploy role's scale, rollout (surge, protection, AZRebalance; behind the gateway no target group
drain), Instance Connect key
push, ami.latest, image.push, gateway.roll, usage and status (its spot notices); the runtime hosts' role's boot, lifecycle
action, metrics, logs and image pull through the AWS CLI. None is denied, and each statement of
the EC2 paths is needed by one of them (``test_task_actors.py`` adds these calls to its report).
"""

from __future__ import annotations

import pytest

from tests.aws_host import aws_cli
from tests.e2e import ec2_actors, iam_simulation

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The statements only an EC2 stack's paths need (the local stack's tasks need the others).
EC2_STATEMENTS = {
    ("deploy", "PushRuntimeImages"),
    ("deploy", "LogInToTheRegistry"),
    ("deploy", "SeeTheCluster"),
    ("deploy", "SurgeItsNodeGroups"),
    ("deploy", "RefreshItsGatewayHosts"),
    ("deploy", "ReadPublishedAmiIds"),
    ("deploy", "PushItsSshKeyToItsInstances"),
    ("deploy", "ReadItsUsage"),
    ("deploy", "ListItsUsage"),
    ("deploy", "ReadItsInterruptionNotices"),
    ("host", "PullTheRuntimeImage"),
    ("host", "LogInToTheRegistry"),
    ("host", "WriteItsLogs"),
    ("host", "PutRuntimeMetrics"),
    ("host", "ReadTheCurrentRelease"),
    ("host", "ListTheCurrentRelease"),
    ("host", "RecordItsBoot"),
    ("host", "EncryptWhatItWrites"),
    ("host", "SeeItsLifecycleState"),
    ("host", "CompleteItsLifecycleActions"),
}
# Calls moto 5.2 checks and logs, then answers that it does not implement.
UNIMPLEMENTED = {
    "StartInstanceRefresh",
    "DescribeInstanceRefreshes",
    "CompleteLifecycleAction",
    "GetDownloadUrlForLayer",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return ec2_actors.exercise(tmp_path_factory.mktemp("ec2-actors"), aws_cli())


@pytest.fixture(scope="module")
def evaluation(run):
    prod, log, _ = run
    return ec2_actors.evaluate(prod, log)


def test_each_path_ran_as_its_actor(run):
    prod, log, seen = run
    assert seen["rollout"].startswith("succeeded: surge: +1 host(s) first"), seen
    assert seen["instance connect"].startswith(f"{prod.settings.inventory.ssh_user}@i-")
    assert seen["lifecycle state"].endswith("InService")
    by_actor = {
        actor: {line["operation"] for line in log if line["principal"].endswith(f"-{actor}")}
        for actor in ("deploy", "host")
    }
    assert {
        "SetDesiredCapacity", "SetInstanceProtection", "SuspendProcesses", "ResumeProcesses",
        "TerminateInstanceInAutoScalingGroup", "SendSSHPublicKey", "GetParameter", "PutImage", "StartInstanceRefresh", "ListBucket",
        "GetQueueUrl", "ReceiveMessage",
    } <= by_actor["deploy"]  # fmt: skip
    assert "interruption notices waiting" in seen["status"], seen["status"]
    assert "spot interruption" in seen["status"] and "i-1234567890abcdef0" in seen["status"]
    assert {
        "DescribeAutoScalingInstances", "CompleteLifecycleAction", "PutMetricData", "PutLogEvents",
        "GetAuthorizationToken", "BatchGetImage",
    } <= by_actor["host"]  # fmt: skip


def test_behind_the_gateway_the_deploy_role_neither_may_nor_does_register_a_target(run):
    prod, log, _ = run
    calls = {line["operation"] for line in log if line["principal"].endswith("-deploy")}
    assert not {"RegisterTargets", "DeregisterTargets"} & calls
    deploy = ec2_actors.documents(prod.settings, prod.saved, prod.release_key_arn)["deploy"]["deploy"]
    granted = {
        a
        for s in deploy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert not {"elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"} & granted


def test_moto_checks_the_calls_it_does_not_implement_before_refusing_them(run):
    _, log, seen = run
    assert {line["operation"] for line in log} >= UNIMPLEMENTED
    assert seen["gateway.roll"] == "start_instance_refresh, describe_instance_refreshes"


def test_every_recorded_call_is_allowed_by_the_unwidened_prod_documents(evaluation, capsys):
    with capsys.disabled():
        print(
            f"\n  iam-simulate (prod): {len(evaluation.calls)} distinct calls, {len(evaluation.denied)} denied"
        )
        for call, decision in evaluation.denied:
            print(f"    DENIED {call.describe()} ({decision['decision']}, {call.operation})")
    assert evaluation.denied == []


def test_every_statement_of_the_ec2_paths_is_needed_by_a_recorded_call(evaluation):
    needed = {key for key, calls in iam_simulation.needed_across(evaluation).items() if calls}
    assert sorted(EC2_STATEMENTS - needed) == []


def _variant(evaluation, operation: str, within: str = "", **changes) -> iam_simulation.Call:
    """A recorded call of ``operation`` (on a resource naming ``within``), with ``changes``."""
    call = next(c for c in evaluation.calls if c.operation == operation and within in c.resource)
    context = dict(call.context) | changes.pop("context", {})
    return iam_simulation.Call(
        call.principal,
        call.action,
        changes.pop("resource", call.resource),
        tuple(sorted(context.items())),
        operation,
    )


def _other_action(evaluation, operation: str, action: str) -> iam_simulation.Call:
    """A recorded call of ``operation`` as ``action`` on the same resource."""
    call = next(c for c in evaluation.calls if c.operation == operation)
    return iam_simulation.Call(call.principal, action, call.resource, call.context, action.split(":")[1])


def test_the_conditions_are_evaluated_not_taken_as_met(run, evaluation):
    prod, _, _ = run
    calls = [
        # Instance Connect: another OS user, or another stack's instance.
        _variant(evaluation, "SendSSHPublicKey", context={"ec2:osuser": "root"}),
        _variant(evaluation, "SendSSHPublicKey", context={"aws:ResourceTag/frontier:stack": "staging"}),
        # Another stack's auto scaling group.
        _variant(evaluation, "StartInstanceRefresh", context={"aws:ResourceTag/frontier:stack": "staging"}),
        # fab usage lists only under the metering prefix.
        _variant(evaluation, "ListBucket", "metering", context={"s3:prefix": "elsewhere/"}),
        # A parameter of the account, not one AWS publishes.
        _variant(
            evaluation,
            "GetParameter",
            resource=f"arn:aws:ssm:{prod.region}:{ec2_actors.ACCOUNT}:parameter/frontier/prod/anything",
        ),
        # fab status reads its own stack's notice queue, and only reads it.
        _variant(
            evaluation,
            "ReceiveMessage",
            resource=f"arn:aws:sqs:{prod.region}:{ec2_actors.ACCOUNT}:frontier-staging-interruptions",
        ),
        *(
            _other_action(evaluation, "ReceiveMessage", action)
            for action in (
                "sqs:DeleteMessage",
                "sqs:ChangeMessageVisibility",
                "sqs:SendMessage",
                "sqs:PurgeQueue",
            )
        ),
    ]
    account = ec2_actors.account(prod.settings, prod.saved)
    decisions = iam_simulation.simulate(
        {"all": iam_simulation.policy_set(prod.settings, account.documents)}, calls
    )["all"]
    assert [d["decision"] for d in decisions] == ["ImplicitlyDenied"] * len(calls), decisions
