"""IAM: the runtime hosts' instance role and the role ``fab`` assumes to deploy.

The runtime role can do exactly what a serving host needs: read the objects under its model's
prefix of the weights bucket (the manifest names every key: it never lists), read its API-keys secret, decrypt with the stack's key (only via S3 and Secrets Manager),
pull the runtime image, write its own log groups, and put metrics in the ``Frontier/Runtime``
namespace. When hosts are reached through Session Manager (no bastion), it also runs the SSM agent.

The deploy role is for operators and CI running ``fab``: deploy history and locks, weights push,
image push, draining targets in its own target group, reading the state of its node groups and alarms,
refreshing its gateway's hosts, reading its gateway's metering records (``fab usage``) and
``fab keys.rotate`` of its runtimes' API-keys secret. Rotation is the deploy role's right, not a
separate operator role's: whoever can deploy can already ship a release that reads that secret on
every host, so a role of its own would add a credential to guard without taking any power away.
Neither role has a wildcard action on a data service.

Which principal runs which task. ``tests/e2e/test_task_actors.py`` runs the deploy role's tasks the
local stack has (weights.push, release.build, deploy, status, history, keys.rotate under
load, rollback, weights.gc, scale) as the ``fab`` command, signing with the deploy user's key against
moto's server enforcing these documents, while the host slots run as the runtime role; then it
evaluates every call moto allowed against the documents as AWS would, conditions included
(``tools/iam-simulate``): none is denied. The EC2 paths the local stack never takes (auto scaling,
target groups, Instance Connect, ECR, the AMI parameters, the metering bucket, a host's boot, logs,
metrics and lifecycle actions) run in ``tests/e2e/test_ec2_actors.py`` with the prod stack's
documents, each actor with its own key, against moto's server enforcing them, and are evaluated
the same way. Every statement is needed by some recorded call; docs/demo.md ("IAM, enforced") has
the table, and says which calls moto authorises but does not carry out.

=================================================================  ===========================
task                                                               principal
=================================================================  ===========================
deploy, rollback, status, history, scale, verify, weights.push,    the deploy role
weights.gc, release.build, image.push, keys.rotate, gateway.roll,
usage, batch
a host's bootstrap, agent, metrics publisher, runtime              the runtime hosts' role
the gateway process                                                the gateway's role
``pulumi up``                                                      the account's administrator
=================================================================  ===========================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
from frontier_hostside.names import BOOT_RECORDS_PREFIX, HOST_TOOLS_PREFIX, REPLICAS_PREFIX
from frontier_hostside.names import CLOUDWATCH_NAMESPACE as METRIC_NAMESPACE

from infra.cloud import Cloud
from infra.monitoring import LOG_GROUP_ROOT
from infra.tags import STACK_TAG

ECR_PULL = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
ECR_PUSH = [
    *ECR_PULL,
    "ecr:InitiateLayerUpload",
    "ecr:UploadLayerPart",
    "ecr:CompleteLayerUpload",
    "ecr:PutImage",
    "ecr:DescribeImages",
]
# What the SSM agent itself calls; none of these touch data.
SSM_AGENT = [
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
]
# Peer-scanner exceptions (`make scan`, checkov) for one statement each, keyed by its Sid: the scan
# lifts that statement into a policy of its own and skips only there. No reason may hold a "=".
CHECKOV_EXCEPTIONS: dict[str, dict[str, str]] = {
    "RunTheSessionManagerAgent": {
        "CKV_AWS_111": "the Session Manager agent's own calls on *, as AWS's AmazonSSMManagedInstanceCore grants "
        "them (its ssmmessages and ec2messages channels take no resource); only stacks whose hosts are reached "
        "through Session Manager grant it",
    },
}
# What a booting host reads under the history prefix: deploy records, releases (with a wheel's
# artifact where a release runs from one), the host tools.
BOOT_READS = ("artifacts", HOST_TOOLS_PREFIX.rstrip("/"), "records", "releases")
# The lifecycle actions a host completes (launch: ready or not; terminate: drained), on its own groups.
LIFECYCLE_ACTIONS = ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"]
DEPLOY_SESSION_S = 4 * 3600  # a canary, gates and a drain per batch can take hours on a large group


@dataclass(frozen=True)
class IdentityArgs:
    stack: str
    cloud: Cloud
    weights_bucket_arn: pulumi.Input[str]
    weights_prefix: str
    history_bucket_arn: pulumi.Input[str]
    history_prefix: str
    kms_key_arn: pulumi.Input[str]
    api_keys_secret_arn: pulumi.Input[str]
    repository_arn: pulumi.Input[str]
    target_group_arn: pulumi.Input[str]
    ssm_access: bool
    tags: Mapping[str, str]
    # The user `fab` logs in as (inventory.ssh_user): the only one its pushed keys are for, when set.
    ssh_user: str = ""
    # On a stack of several models, the hosts' pool keeps its releases, records, host tools and boot
    # records under a prefix of its own (frontier.release.history.stack_history); the artifacts stay
    # under history_prefix, shared by the pools. "" where the stack serves one model.
    pool_history_prefix: str = ""
    # A node group whose replica spans several nodes: its hosts claim slots under replicas/.
    replica_slots: bool = False
    # Where the stack's gateway meters (gateway.metering.uri): `fab usage` reads it as the deploy
    # role where it is an S3 location. "" without a gateway.
    metering_uri: str = ""


def _statement(
    sid: str, actions: list[str] | str, resources: Any, condition: dict | None = None
) -> dict[str, Any]:
    statement = {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def _objects(bucket_arn: pulumi.Input[str], prefix: str) -> pulumi.Output[str] | str:
    # A bucket ARN known as a plain string (the local stack renders these documents without
    # Pulumi) gives a plain string, so the document can be written as JSON as it is.
    if isinstance(bucket_arn, str):
        return f"{bucket_arn}/{prefix.strip('/')}/*"
    return pulumi.Output.concat(bucket_arn, "/", prefix.strip("/"), "/*")


def _list_prefix(sid: str, bucket_arn: pulumi.Input[str], prefix: str) -> dict[str, Any]:
    prefix = prefix.strip("/")
    return _statement(
        sid, "s3:ListBucket", bucket_arn, {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}
    )


def log_groups_arn(cloud: Cloud, stack: str) -> str:
    return cloud.arn("logs", f"log-group:{LOG_GROUP_ROOT}/{stack}/*")


def boot_read_prefixes(args: IdentityArgs) -> list[str]:
    """The history prefixes a booting host reads: the stack's artifacts, and its pool's host tools,
    records and releases (the stack's own where it serves one model)."""
    pool = args.pool_history_prefix or args.history_prefix
    return [
        (args.history_prefix if sub == "artifacts" else pool).rstrip("/") + "/" + sub for sub in BOOT_READS
    ]


def host_boot_statements(args: IdentityArgs) -> list[dict[str, Any]]:
    """What an EC2 host needs to bootstrap itself (pods get their release from Kubernetes)."""
    cloud = args.cloud
    reads = boot_read_prefixes(args)
    pool = args.pool_history_prefix or args.history_prefix
    return [
        # A host bootstraps itself: the current good release from the history (read only), the host
        # tools beside it, and its own boot record under boots/ (never records/, which says what
        # is current: a host cannot make a release current).
        _statement(
            "ReadTheCurrentRelease",
            "s3:GetObject",
            [_objects(args.history_bucket_arn, prefix) for prefix in reads],
        ),
        _statement(
            "ListTheCurrentRelease",
            "s3:ListBucket",
            args.history_bucket_arn,
            {
                "StringLike": {
                    "s3:prefix": [f"{prefix.strip('/')}/*" for prefix in reads]
                    + [prefix.strip("/") for prefix in reads]
                }
            },
        ),
        _statement(
            "RecordItsBoot",
            "s3:PutObject",
            _objects(args.history_bucket_arn, pool + BOOT_RECORDS_PREFIX.rstrip("/")),
        ),
        _statement(
            "EncryptItsBootRecord",
            "kms:GenerateDataKey",
            args.kms_key_arn,
            {"StringEquals": {"kms:ViaService": f"s3.{cloud.region}.{cloud.dns_suffix}"}},
        ),
        # Which group and lifecycle state the host is in (describe calls cannot be scoped). The
        # replica rendezvous asks the same of the hosts holding slots: is each still in its group?
        _statement("SeeItsLifecycleState", "autoscaling:DescribeAutoScalingInstances", "*"),
        *(replica_slot_statements(args.history_bucket_arn, pool) if args.replica_slots else []),
    ]


def replica_slot_statements(history_bucket_arn: pulumi.Input[str], pool_prefix: str) -> list[dict[str, Any]]:
    """A replica over several nodes: a host claims its slot (replica, node) with a conditional put
    and reads its leader's (frontier_hostside/rendezvous.py); nothing else under the prefix."""
    slots = pool_prefix.rstrip("/") + "/" + REPLICAS_PREFIX.rstrip("/")
    return [
        _statement(
            "ClaimItsReplicaSlot", ["s3:GetObject", "s3:PutObject"], _objects(history_bucket_arn, slots)
        ),
        _list_prefix("ListTheReplicaSlots", history_bucket_arn, slots),
    ]


def runtime_policy(args: IdentityArgs, *, hosts: bool = False) -> dict[str, Any]:
    cloud = args.cloud
    logs = log_groups_arn(cloud, args.stack)
    statements = [
        _statement(
            "ReadItsModelWeights",
            ["s3:GetObject", "s3:GetObjectVersion"],
            _objects(args.weights_bucket_arn, args.weights_prefix),
        ),
        _statement(
            "ReadItsApiKeys",
            ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
            args.api_keys_secret_arn,
        ),
        _statement(
            "DecryptWeightsAndSecret",
            "kms:Decrypt",
            args.kms_key_arn,
            {
                "StringEquals": {
                    "kms:ViaService": [
                        f"s3.{cloud.region}.{cloud.dns_suffix}",
                        f"secretsmanager.{cloud.region}.{cloud.dns_suffix}",
                    ]
                }
            },
        ),
        _statement("PullTheRuntimeImage", ECR_PULL, args.repository_arn),
        # Registry logins cannot be scoped to a repository; the token alone reads nothing.
        _statement("LogInToTheRegistry", "ecr:GetAuthorizationToken", "*"),
        _statement(
            "WriteItsLogs",
            ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            [logs, f"{logs}:log-stream:*"],
        ),
        _statement(
            "PutRuntimeMetrics",
            "cloudwatch:PutMetricData",
            "*",
            {"StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}},
        ),
    ]
    if hosts:
        statements += host_boot_statements(args)
    if args.ssm_access:
        statements.append(_statement("RunTheSessionManagerAgent", SSM_AGENT, "*"))
    return {"Version": "2012-10-17", "Statement": statements}


def deploy_policy(args: IdentityArgs) -> dict[str, Any]:
    cloud = args.cloud
    own_stack = {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": args.stack}}
    statements = [
        _statement(
            "ReadWriteDeployHistoryAndLocks",
            ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
            _objects(args.history_bucket_arn, args.history_prefix),
        ),
        _list_prefix("ListDeployHistory", args.history_bucket_arn, args.history_prefix),
        _statement(
            "PushModelWeights",
            ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            _objects(args.weights_bucket_arn, args.weights_prefix),
        ),
        _list_prefix("ListModelWeights", args.weights_bucket_arn, args.weights_prefix),
        # `fab weights.gc`: deletes the versions no kept release needs, under the model's prefix only.
        _statement(
            "CollectUnusedModelWeights",
            "s3:DeleteObject",
            _objects(args.weights_bucket_arn, args.weights_prefix),
        ),
        _statement("EncryptHistoryAndWeights", ["kms:Decrypt", "kms:GenerateDataKey"], args.kms_key_arn),
        # `fab keys.rotate`: read the key set, publish it with a new key first, later without the old.
        _statement(
            "RotateItsApiKeys",
            [
                "secretsmanager:GetSecretValue",
                "secretsmanager:PutSecretValue",
                "secretsmanager:DescribeSecret",
            ],
            args.api_keys_secret_arn,
        ),
        _statement("PushRuntimeImages", ECR_PUSH, args.repository_arn),
        _statement("LogInToTheRegistry", "ecr:GetAuthorizationToken", "*"),
        _statement(
            "DrainAndEnableTargets",
            ["elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"],
            args.target_group_arn,
        ),
        # Describe calls cannot be scoped to a resource in IAM.
        _statement(
            "SeeTheCluster",
            [
                "elasticloadbalancing:DescribeTargetHealth",
                "elasticloadbalancing:DescribeTargetGroups",
                "elasticloadbalancing:DescribeLoadBalancers",
                "autoscaling:DescribeAutoScalingGroups",
                "autoscaling:DescribeScalingActivities",
                "autoscaling:DescribeInstanceRefreshes",
                "ec2:DescribeInstances",
                "cloudwatch:DescribeAlarms",
                "cloudwatch:GetMetricData",
            ],
            "*",
        ),
        # max_surge: grow a node group by a host before draining one, then shrink back; `fab scale`;
        # while a deploy runs, the hosts it touches are protected from scale-in and AZRebalance waits.
        _statement(
            "SurgeItsNodeGroups",
            [
                "autoscaling:SetDesiredCapacity",
                "autoscaling:SetInstanceProtection",
                "autoscaling:SuspendProcesses",
                "autoscaling:ResumeProcesses",
                "autoscaling:TerminateInstanceInAutoScalingGroup",
            ],
            cloud.arn("autoscaling", "autoScalingGroup:*"),
            own_stack,
        ),
        # `fab gateway.roll`: an instance refresh of the gateway's group (of its own stack only).
        _statement(
            "RefreshItsGatewayHosts",
            "autoscaling:StartInstanceRefresh",
            cloud.arn("autoscaling", "autoScalingGroup:*"),
            own_stack,
        ),
        # `fab ami.latest`: the public parameters AWS publishes the AMI ids under.
        _statement(
            "ReadPublishedAmiIds",
            "ssm:GetParameter",
            cloud.arn("ssm", "parameter/aws/service/*", account=False),
        ),
    ]
    statements += usage_statements(args)
    # `fab` admits itself to a host with a key of its run, pushed by EC2 Instance Connect just before
    # it connects (frontier/targets/ec2/access.py), through Session Manager or the bastion alike.
    # Only instances of this stack, and only as its inventory.ssh_user where the stack names one.
    push_to_own_instances = {f"aws:ResourceTag/{STACK_TAG}": args.stack}
    if args.ssh_user:
        push_to_own_instances["ec2:osuser"] = args.ssh_user
    statements.append(
        _statement(
            "PushItsSshKeyToItsInstances",
            "ec2-instance-connect:SendSSHPublicKey",
            cloud.arn("ec2", "instance/*"),
            {"StringEquals": push_to_own_instances},
        )
    )
    if args.ssm_access:
        statements += [
            _statement(
                "SshOverSessionManager",
                "ssm:StartSession",
                cloud.arn("ec2", "instance/*"),
                {"StringEquals": {f"ssm:resourceTag/{STACK_TAG}": args.stack}},
            ),
            _statement(
                "UseTheSshSessionDocument",
                "ssm:StartSession",
                cloud.arn("ssm", "document/AWS-StartSSHSession", account=False),
            ),
            _statement(
                "EndItsSessions",
                ["ssm:TerminateSession", "ssm:ResumeSession"],
                cloud.arn("ssm", "session/${aws:userid}-*"),
            ),
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def usage_statements(args: IdentityArgs) -> list[dict[str, Any]]:
    """`fab usage`: list and read the gateway's metering records under their S3 prefix (the prefix
    the gateway's role writes under, infra/gateway.py); nothing where the stack meters elsewhere."""
    if not args.metering_uri.startswith("s3://"):
        return []
    bucket, _, prefix = args.metering_uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/") or "metering"
    bucket_arn = f"arn:{args.cloud.partition}:s3:::{bucket}"
    return [
        _statement("ReadItsUsage", "s3:GetObject", _objects(bucket_arn, prefix)),
        _list_prefix("ListItsUsage", bucket_arn, prefix),
    ]


def trust(principal: dict[str, str], condition: dict | None = None) -> str:
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": principal, "Action": "sts:AssumeRole"}
    if condition:
        statement["Condition"] = condition
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


class Identity(pulumi.ComponentResource):
    runtime_role_arn: pulumi.Output[str]
    runtime_role_name: pulumi.Output[str]
    instance_profile_arn: pulumi.Output[str]
    deploy_role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: IdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:identity:Identity", name, None, opts)
        self.name = name
        child = pulumi.ResourceOptions(parent=self)
        tags, cloud = dict(args.tags), args.cloud

        runtime = aws.iam.Role(
            f"{name}-runtime",
            description=f"Frontier {args.stack}: runtime hosts",
            assume_role_policy=trust({"Service": cloud.service_principal("ec2")}),
            tags=tags,
            opts=child,
        )
        runtime_grants = aws.iam.RolePolicy(
            f"{name}-runtime",
            role=runtime.id,
            policy=pulumi.Output.json_dumps(runtime_policy(args, hosts=True)),
            opts=child,
        )
        lifecycle = aws.iam.RolePolicy(
            f"{name}-lifecycle",
            role=runtime.name,
            policy=json.dumps(lifecycle_policy(cloud, args.stack)),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-runtime", role=runtime.name, tags=tags, opts=child)

        deploy = aws.iam.Role(
            f"{name}-deploy",
            description=f"Frontier {args.stack}: fab deploy, rollback, weights and image push",
            # Principals of this account that IAM allows to assume it; the account decides who.
            assume_role_policy=trust({"AWS": cloud.account_root}),
            max_session_duration=DEPLOY_SESSION_S,
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-deploy", role=deploy.id, policy=pulumi.Output.json_dumps(deploy_policy(args)), opts=child
        )

        self.runtime_role_arn, self.instance_profile_arn = runtime.arn, profile.arn
        self.runtime_role_name = runtime.name
        # What a host's role may do the moment it boots: its groups wait for these (depends_on).
        self.host_permissions: list[pulumi.Resource] = [runtime_grants, lifecycle, profile]
        self.deploy_role_arn = deploy.arn
        self.register_outputs({"runtime_role_arn": runtime.arn, "deploy_role_arn": deploy.arn})


def lifecycle_policy(cloud: Cloud, stack: str) -> dict[str, Any]:
    """The runtime hosts may complete lifecycle actions only on groups tagged with their stack.

    Scoped by tag, not by ARN: a group's ARN exists only once the group does, and a group's create
    waits for hosts that need this permission to pass their launch hook.
    """
    return {
        "Version": "2012-10-17",
        "Statement": [
            _statement(
                "CompleteItsLifecycleActions",
                LIFECYCLE_ACTIONS,
                cloud.arn("autoscaling", "autoScalingGroup:*"),
                {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": stack}},
            )
        ],
    }
