"""The policy documents of a stack's principals: the runtime hosts or pods of each pool, the deploy
role ``fab`` assumes, and the lifecycle grant of a host.

The runtime principal can do exactly what a serving host needs: read the objects under its pool's
prefix of the weights bucket (the manifest names every key: it never lists), write the prepared
weights of those versions under ``<version>/prepared/`` and the GPU kernels it compiled under
``<version>/kernels/`` (what its start computed, for the next host; encrypting with the stack's key
via S3 only), read its pool's
API-keys secret (no other pool's), decrypt with the stack's key (only via S3 and Secrets Manager), pull the runtime image, write
its own log groups, and put metrics in the ``Frontier/Runtime`` namespace. When hosts are reached
through Session Manager (no bastion), it also runs the SSM agent.

The deploy role is for operators and CI running ``fab``: deploy history and locks, weights push,
image push, draining targets in its own target group, reading the state of its node groups and alarms,
refreshing its gateway's hosts, reading its gateway's metering records (``fab usage``), reading
the notices on its interruption queue (``fab status``, where a node group buys spot or a Capacity
Block) and ``fab keys.rotate`` of every pool's API-keys secret. Rotation is the deploy role's
right, not a separate operator role's: whoever can deploy can already ship a release that reads
that secret on every host, so a role of its own would add a credential to guard without taking
any power away.
Neither role has a wildcard action on a data service.

Which principal runs which task. ``tests/e2e/test_task_actors.py`` runs the deploy role's tasks the
local stack has (weights.push, release.build, deploy, status, history, keys.rotate under load,
rollback, weights.gc, scale) as the ``fab`` command, signing with the deploy user's key against
moto's server enforcing these documents, while the host slots run as their pool's runtime principal;
then it evaluates every call moto allowed against the documents as AWS would, conditions included
(``tools/iam-simulate``): none is denied. The EC2 paths the local stack never takes run in
``tests/e2e/test_ec2_actors.py`` with the prod stack's documents, evaluated the same way.

=================================================================  ===========================
task                                                               principal
=================================================================  ===========================
deploy, rollback, status, history, scale, verify, weights.push,    the deploy role
weights.gc, release.build, image.push, keys.rotate, gateway.roll,
usage, batch, restore
a host's bootstrap, agent, metrics publisher, runtime              its pool's runtime principal
the gateway process                                                the gateway's role
``pulumi up``                                                      the account's administrator
=================================================================  ===========================

Every ARN here is a plain string: the Pulumi program resolves its resources' ARNs first and renders
the same documents the local stack renders with its own names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from frontier_hostside.names import BOOT_RECORDS_PREFIX, HOST_TOOLS_PREFIX, REPLICAS_PREFIX, STACK_TAG
from frontier_hostside.names import CLOUDWATCH_NAMESPACE as METRIC_NAMESPACE

from frontier.identity.cloud import Cloud

LOG_GROUP_ROOT = "/frontier"
ECR_PULL = ("ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")
ECR_PUSH = (
    *ECR_PULL,
    "ecr:InitiateLayerUpload",
    "ecr:UploadLayerPart",
    "ecr:CompleteLayerUpload",
    "ecr:PutImage",
    "ecr:DescribeImages",
)
# What the SSM agent itself calls; none of these touch data.
SSM_AGENT = (
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
)
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
LIFECYCLE_ACTIONS = ("autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat")
DEPLOY_SESSION_S = 4 * 3600  # a canary, gates and a drain per batch can take hours on a large group
# Of the hosts' runtime statements, what the runtime process itself uses on Kubernetes: its weights,
# its API keys, the key behind both, its logs and its metrics (boot, image pulls and lifecycle are
# the node's or the kubelet's business there).
POD_STATEMENTS = frozenset(
    {
        "ReadItsModelWeights",
        "KeepItsPreparedWeights",
        "KeepItsCompiledKernels",
        "ReadItsApiKeys",
        "DecryptWeightsAndSecret",
        "EncryptWhatItWrites",
        "WriteItsLogs",
        "PutRuntimeMetrics",
    }
)
# Of the EC2 deploy statements, what `fab` does on Kubernetes too: history and locks, weights and
# image pushes, `fab weights.gc`, `fab usage` where the gateway meters to S3.
KUBERNETES_DEPLOY_STATEMENTS = frozenset(
    {
        "ReadWriteDeployHistoryAndLocks",
        "ListDeployHistory",
        "ListDeployHistoryVersions",
        "ReadDeployHistoryVersions",
        "ListTheBackupCopy",
        "ReadTheBackupCopy",
        "DecryptTheBackupCopy",
        "PushModelWeights",
        "ListModelWeights",
        "CollectUnusedModelWeights",
        "EncryptHistoryAndWeights",
        "PushRuntimeImages",
        "LogInToTheRegistry",
        "ReadItsUsage",
        "ListItsUsage",
        # Releases are signed at deploy on every target.
        "SignReleases",
        # `fab status` reads the spot notices there too (the Node Termination Handler's queue).
        "ReadItsInterruptionNotices",
        # `fab keys.rotate` of every pool's secret, and the canary's check of a pod with its pool's key.
        "RotateItsApiKeys",
    }
)


@dataclass(frozen=True)
class Statement:
    """One Allow statement. Actions and resources keep their written order; one of each is written
    as a string (as AWS shows it back)."""

    sid: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    condition: Mapping[str, Mapping[str, str | tuple[str, ...]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "Sid": self.sid,
            "Effect": "Allow",
            "Action": self.actions[0] if len(self.actions) == 1 else list(self.actions),
            "Resource": self.resources[0] if len(self.resources) == 1 else list(self.resources),
        }
        if self.condition:
            out["Condition"] = {
                test: {key: list(v) if isinstance(v, tuple) else v for key, v in keys.items()}
                for test, keys in self.condition.items()
            }
        return out


@dataclass(frozen=True)
class PolicyDocument:
    statements: tuple[Statement, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"Version": "2012-10-17", "Statement": [s.as_dict() for s in self.statements]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict())

    def only(self, sids: Iterable[str]) -> PolicyDocument:
        keep = frozenset(sids)
        return PolicyDocument(tuple(s for s in self.statements if s.sid in keep))

    def statement(self, sid: str) -> Statement:
        for s in self.statements:
            if s.sid == sid:
                return s
        raise KeyError(f"no statement {sid!r}: {', '.join(s.sid for s in self.statements)}")

    def __add__(self, more: Iterable[Statement]) -> PolicyDocument:
        return PolicyDocument((*self.statements, *more))


def allow(
    sid: str,
    actions: str | Iterable[str],
    resources: str | Iterable[str],
    condition: Mapping[str, Mapping[str, str | tuple[str, ...]]] | None = None,
) -> Statement:
    return Statement(
        sid,
        (actions,) if isinstance(actions, str) else tuple(actions),
        (resources,) if isinstance(resources, str) else tuple(resources),
        dict(condition or {}),
    )


@dataclass(frozen=True)
class IdentityArgs:
    """What a principal's documents name: one pool's weights prefix, secret and history path (the
    runtime principal), or the stack's (the deploy role, which deploys every pool)."""

    stack: str
    cloud: Cloud
    weights_bucket_arn: str
    weights_prefix: str
    history_bucket_arn: str
    history_prefix: str
    kms_key_arn: str
    # The API-keys secrets it reads: its pool's alone (a runtime principal), every pool's (the
    # deploy role, which rotates them).
    api_keys_secret_arns: tuple[str, ...]
    repository_arn: str
    # The ALB target group a rollout drains runtime hosts from; "" where none does (a stack behind
    # its gateway, Kubernetes).
    target_group_arn: str
    ssm_access: bool
    # The user `fab` logs in as (inventory.ssh_user): the only one its pushed keys are for, when set.
    ssh_user: str = ""
    # On a stack of several models, a pool keeps its releases, records, host tools and boot records
    # under a prefix of its own (frontier.release.history.pool_history_prefix); the artifacts stay
    # under history_prefix, shared by the pools. "" where the stack serves one model.
    pool_history_prefix: str = ""
    # A node group whose replica spans several nodes: its hosts claim slots under replicas/.
    replica_slots: bool = False
    # The deploy role pushes and collects every pool's weights: each pool's prefix (their common
    # root may be the whole bucket, which no pool needs). Empty: weights_prefix alone.
    weights_prefixes: tuple[str, ...] = ()
    # Where the stack's gateway meters (gateway.metering.uri): `fab usage` reads it as the deploy
    # role where it is an S3 location. "" without a gateway.
    metering_uri: str = ""
    # The release key (frontier.release.signing): the deploy role alone signs with it; hosts read its
    # public key when provisioned. "" where the stack has none.
    release_key_arn: str = ""
    # The history's copy in backup.region (infra/backup.py): `fab restore --from backup` reads it and
    # decrypts with the key of ``backup_key_alias`` there. "" where the stack keeps no copy.
    backup_bucket_arn: str = ""
    backup_region: str = ""
    backup_key_alias: str = ""
    # The stack's queue of EC2 interruption notices (infra/interruptions.py): `fab status` reads it.
    # "" where every node group buys on-demand (no queue).
    interruption_queue_arn: str = ""
    # A rollout by traffic share (rollout.traffic_steps) where the ALB fronts the runtimes: the second
    # target group the new release's hosts serve from, and the API's listener rule that weighs the
    # two (frontier/targets/ec2/balancer.py). "" elsewhere.
    canary_target_group_arn: str = ""
    api_rule_arn: str = ""


def objects(bucket_arn: str, prefix: str) -> str:
    prefix = prefix.strip("/")
    return f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"


def list_prefix(sid: str, bucket_arn: str, *prefixes: str) -> Statement:
    keys = tuple(key for p in (p.strip("/") for p in prefixes) for key in (p, f"{p}/*"))
    return allow(sid, "s3:ListBucket", bucket_arn, {"StringLike": {"s3:prefix": keys}})


def read_versions(bucket_arn: str, prefix: str, sids: tuple[str, str]) -> list[Statement]:
    """The versions of the objects under ``prefix``, listed and read (``sids``: the two statements').
    No s3:DeleteObjectVersion: what reads them never removes a version or a delete marker."""
    list_sid, read_sid = sids
    condition = list_prefix("", bucket_arn, prefix).condition
    return [
        allow(list_sid, "s3:ListBucketVersions", bucket_arn, condition),
        allow(read_sid, "s3:GetObjectVersion", objects(bucket_arn, prefix)),
    ]


def log_groups_arn(cloud: Cloud, stack: str) -> str:
    return cloud.arn("logs", f"log-group:{LOG_GROUP_ROOT}/{stack}/*")


def log_group_name(stack: str, purpose: str) -> str:
    """``/frontier/<stack>/<purpose>``: where a host's agent (EC2) or the pods' shipper (EKS) writes."""
    return f"{LOG_GROUP_ROOT}/{stack}/{purpose}"


# What a log shipper needs to write into a group that exists: a stream per source, its events, and
# the streams it finds after a restart.
LOG_SHIPPER_ACTIONS = ("logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams")


def log_shipper_policy(cloud: Cloud, groups: Sequence[str]) -> dict[str, Any]:
    """Write into exactly ``groups`` (names) and no other: their streams, nothing that makes a group or
    changes its retention or key."""
    arns = [cloud.arn("logs", f"log-group:{group}") for group in groups]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ShipPodLogs",
                "Effect": "Allow",
                "Action": list(LOG_SHIPPER_ACTIONS),
                # DescribeLogStreams acts on the group (written with or without a trailing ":*"), the
                # other two on one of its streams (":log-stream:<name>", which ":*" covers).
                "Resource": [r for arn in arns for r in (arn, f"{arn}:*")],
            }
        ],
    }


def boot_read_prefixes(args: IdentityArgs) -> list[str]:
    """The history prefixes a booting host reads: the stack's artifacts, and its pool's host tools,
    records and releases (the stack's own where it serves one model)."""
    pool = args.pool_history_prefix or args.history_prefix
    return [
        (args.history_prefix if sub == "artifacts" else pool).rstrip("/") + "/" + sub for sub in BOOT_READS
    ]


def host_boot_statements(args: IdentityArgs) -> list[Statement]:
    """What an EC2 host needs to bootstrap itself (pods get their release from Kubernetes)."""
    reads = boot_read_prefixes(args)
    pool = args.pool_history_prefix or args.history_prefix
    return [
        # A host bootstraps itself: the current good release from the history (read only), the host
        # tools beside it, and its own boot record under boots/ (never records/, which says what
        # is current: a host cannot make a release current).
        allow("ReadTheCurrentRelease", "s3:GetObject", [objects(args.history_bucket_arn, p) for p in reads]),
        allow(
            "ListTheCurrentRelease",
            "s3:ListBucket",
            args.history_bucket_arn,
            {
                "StringLike": {
                    "s3:prefix": tuple([f"{p.strip('/')}/*" for p in reads] + [p.strip("/") for p in reads])
                }
            },
        ),
        allow(
            "RecordItsBoot",
            "s3:PutObject",
            objects(args.history_bucket_arn, pool + BOOT_RECORDS_PREFIX.rstrip("/")),
        ),
        # Its boot record is encrypted under the stack's key by EncryptWhatItWrites (runtime_policy).
        # Which group and lifecycle state the host is in (describe calls cannot be scoped). The
        # replica rendezvous asks the same of the hosts holding slots: is each still in its group?
        allow("SeeItsLifecycleState", "autoscaling:DescribeAutoScalingInstances", "*"),
        *(replica_slot_statements(args.history_bucket_arn, pool) if args.replica_slots else []),
        # The release key's public half, written to <root>/release-key.pub at boot: from then on
        # the host's agent runs only releases it verifies (frontier_hostside.release_signature).
        *(
            [allow("ReadTheReleaseKey", ("kms:GetPublicKey", "kms:Verify"), args.release_key_arn)]
            if args.release_key_arn
            else []
        ),
    ]


def replica_slot_statements(history_bucket_arn: str, pool_prefix: str) -> list[Statement]:
    """A replica over several nodes: a host claims its slot (replica, node) with a conditional put
    and reads its leader's (frontier_hostside/rendezvous.py); nothing else under the prefix."""
    slots = pool_prefix.rstrip("/") + "/" + REPLICAS_PREFIX.rstrip("/")
    return [
        allow("ClaimItsReplicaSlot", ("s3:GetObject", "s3:PutObject"), objects(history_bucket_arn, slots)),
        list_prefix("ListTheReplicaSlots", history_bucket_arn, slots),
    ]


def runtime_policy(args: IdentityArgs, *, hosts: bool = False) -> PolicyDocument:
    """A pool's runtime principal: ``hosts`` adds what an EC2 host does to boot itself."""
    cloud = args.cloud
    logs = log_groups_arn(cloud, args.stack)
    statements = [
        allow(
            "ReadItsModelWeights",
            ("s3:GetObject", "s3:GetObjectVersion"),
            objects(args.weights_bucket_arn, args.weights_prefix),
        ),
        # What a load computes from the weights (the runtime's storage/prepared.py) is kept beside its
        # weights version for the next host: written under <version>/prepared/ only, never a weight.
        allow(
            "KeepItsPreparedWeights",
            ("s3:PutObject", "s3:AbortMultipartUpload"),
            objects(args.weights_bucket_arn, f"{args.weights_prefix.strip('/')}/*/prepared".lstrip("/")),
        ),
        # The GPU kernels a start compiled (the runtime's storage/kernel_cache.py), kept the same way:
        # one archive per engine kind under <version>/kernels/.
        allow(
            "KeepItsCompiledKernels",
            "s3:PutObject",
            objects(args.weights_bucket_arn, f"{args.weights_prefix.strip('/')}/*/kernels".lstrip("/")),
        ),
        allow(
            "ReadItsApiKeys",
            ("secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"),
            args.api_keys_secret_arns,
        ),
        allow(
            "DecryptWeightsAndSecret",
            "kms:Decrypt",
            args.kms_key_arn,
            {
                "StringEquals": {
                    "kms:ViaService": (
                        f"s3.{cloud.region}.{cloud.dns_suffix}",
                        f"secretsmanager.{cloud.region}.{cloud.dns_suffix}",
                    )
                }
            },
        ),
        # What it writes to S3 under the stack's key: its prepared weights, and an EC2 host's boot record.
        allow(
            "EncryptWhatItWrites",
            "kms:GenerateDataKey",
            args.kms_key_arn,
            {"StringEquals": {"kms:ViaService": f"s3.{cloud.region}.{cloud.dns_suffix}"}},
        ),
        allow("PullTheRuntimeImage", ECR_PULL, args.repository_arn),
        # Registry logins cannot be scoped to a repository; the token alone reads nothing.
        allow("LogInToTheRegistry", "ecr:GetAuthorizationToken", "*"),
        allow(
            "WriteItsLogs",
            ("logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"),
            (logs, f"{logs}:log-stream:*"),
        ),
        allow(
            "PutRuntimeMetrics",
            "cloudwatch:PutMetricData",
            "*",
            {"StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}},
        ),
    ]
    if hosts:
        statements += host_boot_statements(args)
    if args.ssm_access:
        statements.append(allow("RunTheSessionManagerAgent", SSM_AGENT, "*"))
    return PolicyDocument(tuple(statements))


def runtime_pod_policy(args: IdentityArgs) -> PolicyDocument:
    """A pool's pods: the hosts' runtime statements the runtime process itself uses."""
    return runtime_policy(args).only(POD_STATEMENTS)


def drain_statements(args: IdentityArgs) -> list[Statement]:
    """A rollout's drain and enable of runtime hosts in the ALB's target group, where the ALB fronts
    them; none where it fronts a gateway (no target group to drain: the runtimes drain themselves,
    frontier/hosts/gateway_fronted.py) or where the load balancer controller owns it (Kubernetes).
    A rollout by traffic share also moves hosts into and out of the canary target group and sets the
    API rule's weights, on those two resources alone."""
    if not args.target_group_arn:
        return []
    statements = [
        allow(
            "DrainAndEnableTargets",
            ("elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"),
            args.target_group_arn,
        )
    ]
    if args.canary_target_group_arn and args.api_rule_arn:
        statements += [
            allow(
                "MoveHostsIntoTheCanaryGroup",
                ("elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"),
                args.canary_target_group_arn,
            ),
            allow("WeighTheTwoGroups", "elasticloadbalancing:ModifyRule", args.api_rule_arn),
            # Describe calls cannot be scoped to a resource in IAM.
            allow("ReadTheWeights", "elasticloadbalancing:DescribeRules", "*"),
        ]
    return statements


def deploy_policy(args: IdentityArgs) -> PolicyDocument:
    cloud = args.cloud
    own_stack = {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": args.stack}}
    groups = cloud.arn("autoscaling", "autoScalingGroup:*")
    weights = args.weights_prefixes or (args.weights_prefix,)
    statements = [
        allow(
            "ReadWriteDeployHistoryAndLocks",
            ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"),
            objects(args.history_bucket_arn, args.history_prefix),
        ),
        list_prefix("ListDeployHistory", args.history_bucket_arn, args.history_prefix),
        # `fab restore`: the earlier versions of the history's objects, read back and put again.
        *read_versions(
            args.history_bucket_arn,
            args.history_prefix,
            ("ListDeployHistoryVersions", "ReadDeployHistoryVersions"),
        ),
        allow(
            "PushModelWeights",
            ("s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"),
            [objects(args.weights_bucket_arn, prefix) for prefix in weights],
        ),
        list_prefix("ListModelWeights", args.weights_bucket_arn, *weights),
        # `fab weights.gc`: deletes the versions no kept release needs, under the models' prefixes only.
        allow(
            "CollectUnusedModelWeights",
            "s3:DeleteObject",
            [objects(args.weights_bucket_arn, prefix) for prefix in weights],
        ),
        allow("EncryptHistoryAndWeights", ("kms:Decrypt", "kms:GenerateDataKey"), args.kms_key_arn),
        # `fab keys.rotate`: read the key set, publish it with a new key first, later without the old.
        allow(
            "RotateItsApiKeys",
            (
                "secretsmanager:GetSecretValue",
                "secretsmanager:PutSecretValue",
                "secretsmanager:DescribeSecret",
            ),
            args.api_keys_secret_arns,
        ),
        allow("PushRuntimeImages", ECR_PUSH, args.repository_arn),
        allow("LogInToTheRegistry", "ecr:GetAuthorizationToken", "*"),
        *drain_statements(args),
        # Describe calls cannot be scoped to a resource in IAM.
        allow(
            "SeeTheCluster",
            (
                "elasticloadbalancing:DescribeTargetHealth",
                "elasticloadbalancing:DescribeTargetGroups",
                "elasticloadbalancing:DescribeLoadBalancers",
                "autoscaling:DescribeAutoScalingGroups",
                "autoscaling:DescribeScalingActivities",
                "autoscaling:DescribeInstanceRefreshes",
                "ec2:DescribeInstances",
                "cloudwatch:DescribeAlarms",
                "cloudwatch:GetMetricData",
            ),
            "*",
        ),
        # max_surge: grow a node group by a host before draining one, then shrink back; `fab scale`;
        # while a deploy runs, the hosts it touches are protected from scale-in and AZRebalance waits.
        allow(
            "SurgeItsNodeGroups",
            (
                "autoscaling:SetDesiredCapacity",
                "autoscaling:SetInstanceProtection",
                "autoscaling:SuspendProcesses",
                "autoscaling:ResumeProcesses",
                "autoscaling:TerminateInstanceInAutoScalingGroup",
            ),
            groups,
            own_stack,
        ),
        # `fab gateway.roll`: an instance refresh of the gateway's group (of its own stack only).
        allow("RefreshItsGatewayHosts", "autoscaling:StartInstanceRefresh", groups, own_stack),
        # `fab ami.latest`: the public parameters AWS publishes the AMI ids under.
        allow(
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
        allow(
            "PushItsSshKeyToItsInstances",
            "ec2-instance-connect:SendSSHPublicKey",
            cloud.arn("ec2", "instance/*"),
            {"StringEquals": push_to_own_instances},
        )
    )
    if args.ssm_access:
        statements += [
            allow(
                "SshOverSessionManager",
                "ssm:StartSession",
                cloud.arn("ec2", "instance/*"),
                {"StringEquals": {f"ssm:resourceTag/{STACK_TAG}": args.stack}},
            ),
            allow(
                "UseTheSshSessionDocument",
                "ssm:StartSession",
                cloud.arn("ssm", "document/AWS-StartSSHSession", account=False),
            ),
            allow(
                "EndItsSessions",
                ("ssm:TerminateSession", "ssm:ResumeSession"),
                cloud.arn("ssm", "session/${aws:userid}-*"),
            ),
        ]
    if args.interruption_queue_arn:
        # `fab status` lists the notices waiting there (frontier/hosts/notices.py): it finds the queue
        # by name and receives with a visibility timeout of 0, so each stays for whoever acts on it.
        # No sqs:DeleteMessage or ChangeMessageVisibility: reading never takes a notice away.
        statements.append(
            allow(
                "ReadItsInterruptionNotices",
                ("sqs:GetQueueUrl", "sqs:ReceiveMessage"),
                args.interruption_queue_arn,
            )
        )
    if args.backup_bucket_arn:
        # `fab restore --from backup`: the history's prefix in the backup copy, read as from versions.
        statements += [
            *read_versions(
                args.backup_bucket_arn, args.history_prefix, ("ListTheBackupCopy", "ReadTheBackupCopy")
            ),
            # The backup key's ARN is the backup component's; its alias is known by name, so the
            # key is named by alias (KMS matches kms:ResourceAliases on Decrypt) and only via S3.
            allow(
                "DecryptTheBackupCopy",
                "kms:Decrypt",
                f"arn:{cloud.partition}:kms:{args.backup_region}:{cloud.account_id}:key/*",
                {
                    "ForAnyValue:StringEquals": {"kms:ResourceAliases": args.backup_key_alias},
                    "StringEquals": {"kms:ViaService": f"s3.{args.backup_region}.{cloud.dns_suffix}"},
                },
            ),
        ]
    if args.release_key_arn:
        # Releases are signed at deploy, by this role alone among the stack's principals
        # (frontier.release.signing); hosts run only what it signed.
        statements.append(allow("SignReleases", ("kms:Sign", "kms:GetPublicKey"), args.release_key_arn))
    return PolicyDocument(tuple(statements))


def kubernetes_deploy_policy(args: IdentityArgs, cluster_arn: str) -> PolicyDocument:
    """The deploy role on Kubernetes: no target groups or auto scaling groups to drive; it may
    describe its own cluster (its Kubernetes access is an EKS access entry)."""
    return deploy_policy(args).only(KUBERNETES_DEPLOY_STATEMENTS) + [
        allow("SeeItsCluster", "eks:DescribeCluster", cluster_arn)
    ]


def usage_statements(args: IdentityArgs) -> list[Statement]:
    """`fab usage`: list and read the gateway's metering records under their S3 prefix (the prefix
    the gateway's role writes under); nothing where the stack meters elsewhere."""
    if not args.metering_uri.startswith("s3://"):
        return []
    bucket, _, prefix = args.metering_uri.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/") or "metering"
    bucket_arn = f"arn:{args.cloud.partition}:s3:::{bucket}"
    return [
        allow("ReadItsUsage", "s3:GetObject", objects(bucket_arn, prefix)),
        list_prefix("ListItsUsage", bucket_arn, prefix),
    ]


def lifecycle_policy(cloud: Cloud, stack: str) -> PolicyDocument:
    """The runtime hosts may complete lifecycle actions only on groups tagged with their stack.

    Scoped by tag, not by ARN: a group's ARN exists only once the group does, and a group's create
    waits for hosts that need this permission to pass their launch hook.
    """
    return PolicyDocument(
        (
            allow(
                "CompleteItsLifecycleActions",
                LIFECYCLE_ACTIONS,
                cloud.arn("autoscaling", "autoScalingGroup:*"),
                {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": stack}},
            ),
        )
    )


def trust(principal: Mapping[str, str], condition: Mapping[str, Any] | None = None) -> str:
    statement: dict[str, Any] = {"Effect": "Allow", "Principal": dict(principal), "Action": "sts:AssumeRole"}
    if condition:
        statement["Condition"] = dict(condition)
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})
