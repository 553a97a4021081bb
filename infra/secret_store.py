"""Secrets: the stack's KMS key and, for each pool, the Secrets Manager secret that holds the API
keys its runtimes accept.

Each pool has a secret of its own (``runtime.api_keys_secret``; the stack check refuses two pools
naming one), which only that pool's principal reads, besides the gateway, the synthetic probe and
the deploy role: one pool's hosts never hold the key that reaches another pool's runtimes. A
one-model stack's secret keeps the resource name it always had; a stack that lists its models names
each pool's after its model, as its principal is named (:func:`frontier.identity.pools.principal_suffix`).

A secret is created empty. Its value never passes through Pulumi (so never through a stack file
or the state, not even encrypted); an operator sets it out of band after the first ``pulumi up``::

    aws secretsmanager put-secret-value --region <region> \\
        --secret-id <runtime.api_keys_secret> --secret-string file://api-keys.json

and rotates it with ``fab keys.rotate``. The runtime reads it by name at start (DESIGN rule 7).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.identity.key_policies import account_administers_through_iam
from infra.cloud import Cloud
from infra.tags import with_tags


@dataclass(frozen=True)
class PoolSecret:
    """One pool's API-keys secret: its model, its name (``runtime.api_keys_secret``) and what its
    resource name adds to the stack's (its principal's suffix: "" on a one-model stack)."""

    model: str
    name: str
    suffix: str


@dataclass(frozen=True)
class SecretsArgs:
    stack: str
    cloud: Cloud
    api_keys_secrets: Sequence[PoolSecret]
    production: bool
    tags: Mapping[str, str]
    #: (region, KMS key ARN there): a replica of the secret in backup.region (infra/backup.py).
    replica: tuple[str, pulumi.Input[str]] | None = None


AUTOSCALING_SERVICE = "autoscaling.amazonaws.com"
AUTOSCALING_ROLE_PATH = f"/aws-service-role/{AUTOSCALING_SERVICE}/"
AUTOSCALING_ROLE_NAME = "AWSServiceRoleForAutoScaling"


def autoscaling_service_role(cloud: Cloud) -> str:
    """The role auto scaling launches instances as (AWS creates it with an account's first group)."""
    return f"arn:{cloud.partition}:iam::{cloud.account_id}:role{AUTOSCALING_ROLE_PATH}{AUTOSCALING_ROLE_NAME}"


def autoscaling_role_exists() -> bool:
    """Whether the account already has auto scaling's service-linked role.

    A key policy naming a principal that does not exist is refused (MalformedPolicyDocument), and AWS
    creates this role only with an account's first auto scaling group — after the key, in a fresh
    account. ``GetRoles`` answers an empty list where ``GetRole`` would fail the program.
    """
    found = aws.iam.get_roles(name_regex=f"^{AUTOSCALING_ROLE_NAME}$", path_prefix=AUTOSCALING_ROLE_PATH)
    return bool(found.arns)


def key_policy(cloud: Cloud) -> str:
    """Account administrators manage the key through IAM; CloudWatch Logs and alarms may use it."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                account_administers_through_iam(cloud),
                {
                    "Sid": "CloudWatchLogsEncryptsThisAccountsGroups",
                    "Effect": "Allow",
                    "Principal": {"Service": cloud.service_principal(f"logs.{cloud.region}")},
                    "Action": [
                        "kms:Encrypt*",
                        "kms:Decrypt*",
                        "kms:ReEncrypt*",
                        "kms:GenerateDataKey*",
                        "kms:Describe*",
                    ],
                    "Resource": "*",
                    "Condition": {
                        "ArnLike": {"kms:EncryptionContext:aws:logs:arn": cloud.arn("logs", "log-group:*")}
                    },
                },
                {
                    # EKS node groups' root volumes are encrypted with this key, and their hosts are
                    # launched by the auto scaling service-linked role, whose own policy (AWS's) has no
                    # KMS permissions: only the key policy can let it use the key.
                    "Sid": "AutoScalingLaunchesEncryptedVolumes",
                    "Effect": "Allow",
                    "Principal": {"AWS": autoscaling_service_role(cloud)},
                    "Action": [
                        "kms:Encrypt",
                        "kms:Decrypt",
                        "kms:ReEncrypt*",
                        "kms:GenerateDataKey*",
                        "kms:DescribeKey",
                    ],
                    "Resource": "*",
                },
                {
                    # ... and hand EBS a grant for the volume's lifetime (to AWS resources only).
                    "Sid": "AutoScalingGrantsEbsTheKey",
                    "Effect": "Allow",
                    "Principal": {"AWS": autoscaling_service_role(cloud)},
                    "Action": "kms:CreateGrant",
                    "Resource": "*",
                    "Condition": {"Bool": {"kms:GrantIsForAWSResource": "true"}},
                },
                {
                    # Alarms publish to the KMS-encrypted SNS topic.
                    "Sid": "CloudWatchAlarmsPublishToTheTopic",
                    "Effect": "Allow",
                    "Principal": {"Service": cloud.service_principal("cloudwatch")},
                    "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                    "Resource": "*",
                    "Condition": {"StringEquals": {"aws:SourceAccount": cloud.account_id}},
                },
            ],
        }
    )


def symmetric_key(
    name: str, description: str, policy: str, tags: Mapping[str, str], opts: pulumi.ResourceOptions
) -> aws.kms.Key:
    """A stack's symmetric key: rotated every year, and kept 30 days (AWS's longest) once scheduled
    for deletion."""
    return aws.kms.Key(
        name,
        description=description,
        key_usage="ENCRYPT_DECRYPT",
        customer_master_key_spec="SYMMETRIC_DEFAULT",
        enable_key_rotation=True,
        deletion_window_in_days=30,
        policy=policy,
        tags=dict(tags),
        opts=opts,
    )


class Secrets(pulumi.ComponentResource):
    key_arn: pulumi.Output[str]
    key_id: pulumi.Output[str]
    #: Each pool's API-keys secret's ARN, by model name.
    api_keys_secret_arns: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: SecretsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:secrets:Secrets", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        # In a fresh account the key's policy needs the role before auto scaling would make it. It is
        # the account's, shared by every stack and by groups outside Frontier: kept when the stack goes,
        # and no longer declared once it exists (the next update forgets it, AWS keeps it).
        linked_role = (
            []
            if autoscaling_role_exists()
            else [
                aws.iam.ServiceLinkedRole(
                    f"{name}-autoscaling-role",
                    aws_service_name=AUTOSCALING_SERVICE,
                    opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True),
                )
            ]
        )
        key = symmetric_key(
            f"{name}-key",
            f"Frontier {args.stack}: weights, history, secrets, logs, alarms",
            key_policy(args.cloud),
            tags,
            pulumi.ResourceOptions(parent=self, depends_on=linked_role),
        )
        aws.kms.Alias(
            f"{name}-key", name=f"alias/frontier-{args.stack}", target_key_id=key.key_id, opts=child
        )

        self.api_keys_secret_arns = {}
        for pool in args.api_keys_secrets:
            keys = (
                f"API keys model {pool.model}'s runtimes accept"
                if pool.suffix
                else "API keys the runtime accepts"
            )
            secret = aws.secretsmanager.Secret(
                f"{name}-api-keys{pool.suffix}",
                name=pool.name,
                description=f"Frontier {args.stack}: {keys}. Value set out of band, never by Pulumi.",
                kms_key_id=key.arn,
                # A deleted secret stays recoverable this long; production keeps the longest window AWS allows.
                recovery_window_in_days=30 if args.production else 7,
                replicas=[{"region": args.replica[0], "kms_key_id": args.replica[1]}]
                if args.replica
                else None,
                tags=with_tags(tags, purpose="api-keys", **({"model": pool.model} if pool.suffix else {})),
                opts=child,
            )
            self.api_keys_secret_arns[pool.model] = secret.arn

        self.key_arn, self.key_id = key.arn, key.key_id
        arns = list(self.api_keys_secret_arns.values())
        self.register_outputs(
            {"key_arn": key.arn, "api_keys_secret_arn": arns[0]}
            if len(arns) == 1
            else {"key_arn": key.arn, "api_keys_secret_arns": self.api_keys_secret_arns}
        )
