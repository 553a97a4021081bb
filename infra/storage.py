"""Storage: the model weights bucket, the deploy history bucket, and the bucket for access logs.

All three are private (public access blocked, owner-enforced objects, TLS-only policy). Weights and
history are versioned and encrypted with the stack's KMS key; old versions expire after a while so
an overwritten model does not cost twice forever. The log bucket uses SSE-S3 because ALB log
delivery cannot write into SSE-KMS buckets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from frontier.config.schema import Settings
from infra.cloud import Cloud
from infra.component import Component
from infra.tags import with_tags

HISTORY_PREFIX_ROOT = "history"
LB_LOG_PREFIX = "alb"
S3_LOG_PREFIX = "s3"


def bucket_suffix(cloud: Cloud) -> str:
    """What makes a bucket name ours alone: S3 names are global across every account and region."""
    return f"-{cloud.account_id}-{cloud.region}"


def unique_bucket_name(stack: str, purpose: str, cloud: Cloud) -> str:
    return f"frontier-{stack}-{purpose}{bucket_suffix(cloud)}"


def metering_bucket_name(stack: str, cloud: Cloud) -> str:
    """The gateway's own metering bucket, made by the stack when ``gateway.metering.uri`` names it."""
    return unique_bucket_name(stack, "metering", cloud)


def metering_problems(settings: Settings, cloud: Cloud) -> Iterator[str]:
    """The gateway meters into a bucket the stack owns: its history bucket, or the metering bucket
    it makes. Any other bucket nothing would create (or someone else owns) is refused here, before a
    gateway writes to it and finds it missing."""
    gateway = settings.gateway
    if gateway is None or not gateway.metering.uri.startswith("s3://"):
        return
    bucket, _ = split_s3_uri(gateway.metering.uri)
    owned = (
        unique_bucket_name(settings.stack, "history", cloud),
        metering_bucket_name(settings.stack, cloud),
    )
    if bucket not in owned:
        yield (
            f"gateway.metering.uri = {gateway.metering.uri!r}: bucket {bucket!r} is not one this stack creates; "
            f"use s3://{owned[1]}/<prefix> (made by the stack) or s3://{owned[0]}/<prefix> (its history bucket)"
        )


def stack_metering_bucket(settings: Settings, cloud: Cloud) -> str:
    """The metering bucket the stack makes for its gateway, or "" where it makes none."""
    gateway = settings.gateway
    if gateway is None or not gateway.metering.uri.startswith("s3://"):
        return ""
    bucket, _ = split_s3_uri(gateway.metering.uri)
    return bucket if bucket == metering_bucket_name(settings.stack, cloud) else ""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → (``bucket``, ``some/prefix``)."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


@dataclass(frozen=True)
class StorageArgs:
    stack: str
    cloud: Cloud
    weights_uri: str
    kms_key_arn: pulumi.Input[str]
    weights_noncurrent_days: int
    history_noncurrent_days: int
    log_expiration_days: int
    tags: Mapping[str, str]
    #: The gateway's metering bucket where it is one of the stack's own (gateway.metering.uri names
    #: :func:`metering_bucket_name`): made here. "" where the gateway meters into the history bucket
    #: or the stack has no gateway.
    metering_bucket: str = ""


@dataclass(frozen=True)
class PrivateBucket:
    name: pulumi.Output[str]
    arn: pulumi.Output[str]
    #: Replication needs versioning on both sides first. None: not versioned.
    versioning: aws.s3.BucketVersioning | None = None


class Storage(Component[StorageArgs]):
    weights_bucket: pulumi.Output[str]
    weights_bucket_arn: pulumi.Output[str]
    weights_prefix: str
    history_bucket: pulumi.Output[str]
    history_bucket_arn: pulumi.Output[str]
    history_prefix: str
    logs_bucket: pulumi.Output[str]

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:storage:Storage", name, args, opts)
        cloud = args.cloud

        logs = self._bucket(
            "logs",
            unique_bucket_name(args.stack, "logs", cloud),
            purpose="access-logs",
            kms_key_arn=None,
            versioned=False,
            lifecycle=[self._expire_rule(args.log_expiration_days)],
            statements=self._log_delivery_statements(unique_bucket_name(args.stack, "logs", cloud)),
        )
        weights_bucket, self.weights_prefix = split_s3_uri(args.weights_uri)
        weights = self._bucket(
            "weights",
            weights_bucket,
            purpose="weights",
            kms_key_arn=args.kms_key_arn,
            versioned=True,
            lifecycle=[noncurrent_rule(args.weights_noncurrent_days)],
            logs_bucket=logs.name,
        )
        history = self._bucket(
            "history",
            unique_bucket_name(args.stack, "history", cloud),
            purpose="history",
            kms_key_arn=args.kms_key_arn,
            versioned=True,
            lifecycle=[noncurrent_rule(args.history_noncurrent_days)],
            logs_bucket=logs.name,
        )
        self.metering: PrivateBucket | None = None
        if args.metering_bucket:
            self.metering = self._bucket(
                "metering",
                args.metering_bucket,
                purpose="metering",
                kms_key_arn=args.kms_key_arn,
                versioned=True,
                lifecycle=[noncurrent_rule(args.history_noncurrent_days)],
                logs_bucket=logs.name,
            )
        self.weights_bucket, self.weights_bucket_arn = weights.name, weights.arn
        self.history = history
        self.history_bucket_name = unique_bucket_name(args.stack, "history", cloud)
        self.history_bucket, self.history_bucket_arn = history.name, history.arn
        self.history_prefix = f"{HISTORY_PREFIX_ROOT}/{args.stack}/"
        # Read through the bucket policy resource, so the ALB waits until log delivery may write.
        self.logs_bucket = logs.name
        self.register_outputs(
            {
                "weights_bucket": weights.name,
                "history_bucket": history.name,
                "history_prefix": self.history_prefix,
                "logs_bucket": logs.name,
            }
        )

    def _bucket(
        self,
        key: str,
        bucket_name: str,
        *,
        purpose: str,
        kms_key_arn: pulumi.Input[str] | None,
        versioned: bool,
        lifecycle: list[dict[str, Any]],
        statements: Sequence[dict[str, Any]] = (),
        logs_bucket: pulumi.Input[str] | None = None,
    ) -> PrivateBucket:
        return private_bucket(
            self,
            f"{self._name}-{key}",
            bucket_name,
            tags=with_tags(dict(self._args.tags), purpose=purpose),
            kms_key_arn=kms_key_arn,
            versioned=versioned,
            lifecycle=lifecycle,
            statements=statements,
            logs=(logs_bucket, f"{S3_LOG_PREFIX}/{key}/") if logs_bucket is not None else None,
        )

    @staticmethod
    def _deny_insecure_transport(bucket_arn: pulumi.Output[str]) -> dict[str, Any]:
        return {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [bucket_arn, pulumi.Output.concat(bucket_arn, "/*")],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }

    def _log_delivery_statements(self, bucket_name: str) -> list[dict[str, Any]]:
        """ALB access logs (the region's ELB account and the newer service principal) and S3 server logs."""
        cloud = self._args.cloud
        arn = f"arn:{cloud.partition}:s3:::{bucket_name}"
        lb_logs = f"{arn}/{LB_LOG_PREFIX}/AWSLogs/{cloud.account_id}/*"
        return [
            {
                "Sid": "ElbAccountWritesAccessLogs",
                "Effect": "Allow",
                "Principal": {"AWS": cloud.elb_account_arn},
                "Action": "s3:PutObject",
                "Resource": lb_logs,
            },
            {
                "Sid": "LogDeliveryWritesAccessLogs",
                "Effect": "Allow",
                "Principal": {"Service": cloud.service_principal("logdelivery.elasticloadbalancing")},
                "Action": "s3:PutObject",
                "Resource": lb_logs,
            },
            {
                "Sid": "S3ServerAccessLogs",
                "Effect": "Allow",
                "Principal": {"Service": cloud.service_principal("logging.s3")},
                "Action": "s3:PutObject",
                "Resource": f"{arn}/{S3_LOG_PREFIX}/*",
                "Condition": {"StringEquals": {"aws:SourceAccount": cloud.account_id}},
            },
        ]

    @staticmethod
    def _expire_rule(days: int) -> dict[str, Any]:
        return {
            "id": "expire-logs",
            "status": "Enabled",
            "filter": {"prefix": ""},
            "expiration": {"days": days},
        }

    @staticmethod
    def _abort_uploads_rule() -> dict[str, Any]:
        # A weights push interrupted mid-multipart leaves invisible parts that are billed until aborted.
        return {
            "id": "abort-incomplete-uploads",
            "status": "Enabled",
            "filter": {"prefix": ""},
            "abort_incomplete_multipart_upload": {"days_after_initiation": 7},
        }


def private_bucket(
    parent: pulumi.Resource,
    name: str,
    bucket_name: str,
    *,
    tags: Mapping[str, str],
    kms_key_arn: pulumi.Input[str] | None,
    versioned: bool,
    lifecycle: list[dict[str, Any]],
    statements: Sequence[dict[str, Any]] = (),
    logs: tuple[pulumi.Input[str], str] | None = None,
    provider: pulumi.ProviderResource | None = None,
) -> PrivateBucket:
    """A bucket of the stack's kind, as a child of ``parent``: owner-enforced objects, public access
    blocked, default encryption (``kms_key_arn``, else SSE-S3), versioning where asked, the lifecycle
    rules given plus aborting stale uploads, server access logs to ``logs`` (bucket, prefix) where
    given, and a policy that refuses requests without TLS. ``provider``: another region's."""
    child = pulumi.ResourceOptions(parent=parent, provider=provider)
    bucket = aws.s3.Bucket(name, bucket=bucket_name, force_destroy=False, tags=dict(tags), opts=child)
    ownership = aws.s3.BucketOwnershipControls(
        name, bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
    )
    block = aws.s3.BucketPublicAccessBlock(
        name,
        bucket=bucket.id,
        block_public_acls=True,
        block_public_policy=True,
        ignore_public_acls=True,
        restrict_public_buckets=True,
        opts=child,
    )
    if kms_key_arn is None:
        default = {"sse_algorithm": "AES256"}
    else:
        default = {"sse_algorithm": "aws:kms", "kms_master_key_id": kms_key_arn}
    aws.s3.BucketServerSideEncryptionConfiguration(
        name,
        bucket=bucket.id,
        # Bucket keys cut KMS requests (and their cost) by orders of magnitude on multi-GB reads.
        rules=[
            {
                "apply_server_side_encryption_by_default": default,
                "bucket_key_enabled": kms_key_arn is not None,
            }
        ],
        opts=child,
    )
    versioning = None
    if versioned:
        versioning = aws.s3.BucketVersioning(
            name, bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child
        )
    aws.s3.BucketLifecycleConfiguration(
        name,
        bucket=bucket.id,
        rules=[*lifecycle, Storage._abort_uploads_rule()],
        opts=pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[versioning] if versioning else [])
        ),
    )
    if logs is not None:
        aws.s3.BucketLogging(
            name,
            bucket=bucket.id,
            target_bucket=logs[0],
            target_prefix=logs[1],
            opts=child,
        )
    policy = aws.s3.BucketPolicy(
        name,
        bucket=bucket.id,
        policy=pulumi.Output.json_dumps(
            {
                "Version": "2012-10-17",
                "Statement": [Storage._deny_insecure_transport(bucket.arn), *statements],
            }
        ),
        # S3 refuses a policy while the public access block is still being applied.
        opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[block, ownership])),
    )
    return PrivateBucket(name=policy.bucket, arn=bucket.arn, versioning=versioning)


def noncurrent_rule(days: int) -> dict[str, Any]:
    """A versioned bucket's lifecycle rule: a version replaced or deleted goes ``days`` later (the
    stack's buckets here, and their copies in the backup region, infra/backup.py)."""
    return {
        "id": "expire-noncurrent-versions",
        "status": "Enabled",
        "filter": {"prefix": ""},
        "noncurrent_version_expiration": {"noncurrent_days": days},
    }
