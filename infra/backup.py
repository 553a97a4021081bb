"""Backup: a second copy of the stack's history and metering in another region, and of its secret.

The decision: **S3 Cross-Region Replication**, not AWS Backup. What the stack must not lose is a
stream of small objects (releases, deploy records, artifacts, metering records) in versioned
buckets. Replication copies each new version within minutes of its write, keeps its key and
version id (so ``fab restore --from backup`` reads the same keys under the same prefix), and
does not replicate delete markers (``delete_marker_replication: Disabled``): a history deleted by
mistake, or by someone who should not have, stays whole in the backup. AWS Backup's S3 backups are
daily or continuous snapshots restored by a restore job into a bucket, billed per GB-month of the
vault and per object restored, and it needs the same versioning; it adds a vault and an IAM role
of its own and a point-in-time restore the bucket's versions already give in-region. Replication
keeps the restore a plain read of a bucket (the same code path as ``--from version``).

What is copied, into ``backup.region``:

- the history bucket, whole, to ``<history bucket>-backup`` (named by
  :func:`frontier.release.restore.backup_bucket_name`), and the gateway's metering bucket where
  the stack makes one, to its own backup bucket; each versioned, encrypted with a key of the backup
  region, public access blocked, TLS only, old versions kept as long as the source keeps them;
- the API-keys secret, as a Secrets Manager replica in the backup region under the backup key
  (``Secrets``' ``replica_region``): Secrets Manager keeps its versions, staging labels and
  rotation state in step. A KMS-encrypted copy rather than metadata alone: names and version ids
  cannot give a region back its keys, and the replica is as closed as the secret (the same
  resource policy applies; only principals granted it may read it).

The replication role can do only replication: read the versions of the source buckets for
replication, replicate into the backup buckets, decrypt with the stack's key via S3 in the stack's
region and encrypt with the backup key via S3 in the backup region. The policy pack refuses a
production stack whose history bucket (or metering bucket) has no enabled replication rule, or
whose rule replicates deletions (``production-backup-copy``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from frontier.identity.documents import trust
from frontier.identity.key_policies import account_administers_through_iam
from frontier.release.restore import backup_bucket_name, backup_key_alias
from infra.cloud import Cloud
from infra.component import Component
from infra.secret_store import symmetric_key
from infra.storage import PrivateBucket, noncurrent_rule, private_bucket
from infra.tags import with_tags

TYPE = "frontier:backup:Backup"
S3_SERVICE = "s3.amazonaws.com"


@dataclass(frozen=True)
class BackupArgs:
    stack: str
    cloud: Cloud
    #: backup.region: where the copies live (never the stack's own region).
    region: str
    #: How long the backup keeps a noncurrent version: the source's own horizon.
    noncurrent_days: int
    tags: Mapping[str, str]


@dataclass(frozen=True)
class ReplicatedBucket:
    """A source bucket: its role in the stack (history, metering), name, ARN, and versioning."""

    purpose: str
    name: str
    bucket: PrivateBucket


class Backup(Component[BackupArgs]):
    """The backup region's provider and key first (the secret's replica needs the key), then
    :meth:`replicate` the stack's buckets once they exist."""

    key_arn: pulumi.Output[str]
    backup_buckets: dict[str, PrivateBucket]

    def __init__(self, name: str, args: BackupArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, args, opts)
        self.provider = aws.Provider(f"{name}-region", region=args.region, opts=self._child)
        there = pulumi.ResourceOptions(parent=self, provider=self.provider)
        key = symmetric_key(
            f"{name}-key",
            f"Frontier {args.stack}: the backup copy of history, metering and secrets",
            json.dumps({"Version": "2012-10-17", "Statement": [account_administers_through_iam(args.cloud)]}),
            with_tags(dict(args.tags), purpose="backup"),
            there,
        )
        aws.kms.Alias(
            f"{name}-key", name=backup_key_alias(args.stack), target_key_id=key.key_id, opts=there
        )
        self.key_arn = key.arn
        self.backup_buckets = {}

    def replicate(self, sources: Sequence[ReplicatedBucket], source_key_arn: pulumi.Input[str]) -> None:
        """Each source bucket replicated, whole, to a backup bucket of its own in the backup region."""
        args = self._args
        for source in sources:
            self.backup_buckets[source.purpose] = private_bucket(
                self,
                f"{self._name}-{source.purpose}",
                backup_bucket_name(source.name, args.cloud.region, args.region),
                tags=with_tags(dict(args.tags), purpose=f"{source.purpose}-backup"),
                kms_key_arn=self.key_arn,
                versioned=True,
                lifecycle=[noncurrent_rule(args.noncurrent_days)],
                provider=self.provider,
            )
        role = aws.iam.Role(
            f"{self._name}-replication",
            description=f"Frontier {args.stack}: S3 replicates history and metering to {args.region}",
            assume_role_policy=trust(
                {"Service": S3_SERVICE}, {"StringEquals": {"aws:SourceAccount": args.cloud.account_id}}
            ),
            tags=dict(args.tags),
            opts=self._child,
        )
        source_arns = [s.bucket.arn for s in sources]
        backup_arns = [self.backup_buckets[s.purpose].arn for s in sources]
        policy = aws.iam.RolePolicy(
            f"{self._name}-replication",
            role=role.id,
            policy=pulumi.Output.all(source_arns, backup_arns, source_key_arn, self.key_arn).apply(
                lambda arns: json.dumps(
                    replication_policy(args.cloud, args.region, arns[0], arns[1], arns[2], arns[3])
                )
            ),
            opts=self._child,
        )
        for source in sources:
            backup = self.backup_buckets[source.purpose]
            waits = [policy, *(v for v in (source.bucket.versioning, backup.versioning) if v is not None)]
            aws.s3.BucketReplicationConfig(
                f"{self._name}-{source.purpose}",
                bucket=source.bucket.name,
                role=role.arn,
                rules=[
                    {
                        "id": f"{source.purpose}-to-{args.region}",
                        "status": "Enabled",
                        "priority": 1,
                        "filter": {"prefix": ""},
                        # A deletion in the stack's region leaves the backup's copy whole.
                        "delete_marker_replication": {"status": "Disabled"},
                        "source_selection_criteria": {"sse_kms_encrypted_objects": {"status": "Enabled"}},
                        "destination": {
                            "bucket": backup.arn,
                            "encryption_configuration": {"replica_kms_key_id": self.key_arn},
                        },
                    }
                ],
                opts=pulumi.ResourceOptions(parent=self, depends_on=waits),
            )
        self.register_outputs(
            {
                "key_arn": self.key_arn,
                **{f"{purpose}_backup_bucket": b.name for purpose, b in self.backup_buckets.items()},
            }
        )


def replication_policy(
    cloud: Cloud,
    region: str,
    source_arns: Sequence[str],
    backup_arns: Sequence[str],
    source_key_arn: str,
    backup_key_arn: str,
) -> dict[str, Any]:
    """What S3 needs to replicate ``source_arns`` into ``backup_arns``, and nothing else."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadTheReplicationConfiguration",
                "Effect": "Allow",
                "Action": ["s3:GetReplicationConfiguration", "s3:ListBucket"],
                "Resource": list(source_arns),
            },
            {
                "Sid": "ReadSourceVersionsForReplication",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObjectVersionForReplication",
                    "s3:GetObjectVersionAcl",
                    "s3:GetObjectVersionTagging",
                ],
                "Resource": [f"{arn}/*" for arn in source_arns],
            },
            {
                "Sid": "ReplicateIntoTheBackup",
                "Effect": "Allow",
                "Action": ["s3:ReplicateObject", "s3:ReplicateTags"],
                "Resource": [f"{arn}/*" for arn in backup_arns],
            },
            {
                "Sid": "DecryptTheSourceViaS3",
                "Effect": "Allow",
                "Action": "kms:Decrypt",
                "Resource": source_key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{cloud.region}.{cloud.dns_suffix}"}},
            },
            {
                "Sid": "EncryptTheReplicaViaS3",
                "Effect": "Allow",
                "Action": ["kms:Encrypt", "kms:GenerateDataKey"],
                "Resource": backup_key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{region}.{cloud.dns_suffix}"}},
            },
        ],
    }
