"""What holds data: buckets, KMS keys, secrets, image repositories and log groups (infra/storage.py,
infra/secret_store.py, infra/registry.py, infra/monitoring.py).

Buckets are stack rules: pulumi-aws 7 spreads a bucket's encryption, versioning, public access block
and policy over resources of their own, which name the bucket by its name or id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from frontier_hostside.names import PURPOSE_TAG
from pulumi_policy import EnforcementLevel, PolicyResource, ResourceValidationArgs

from policy.rules.reading import as_int, as_list, get, policy_document, statements, tags_of, truthy
from policy.rules.validation import of_type, resource_policy, stack_policy

KMS_PURPOSES = ("weights", "history")
VERSIONED_PURPOSES = ("weights", "history")

BUCKET = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_VERSIONING = (
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketVersioningV2:BucketVersioningV2",
)
BUCKET_PUBLIC_ACCESS_BLOCK = ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",)
BUCKET_POLICY = ("aws:s3/bucketPolicy:BucketPolicy",)
SECRET = ("aws:secretsmanager/secret:Secret",)
KMS_KEY = ("aws:kms/key:Key",)
KMS_KEY_POLICY = ("aws:kms/keyPolicy:KeyPolicy",)
ECR_REPOSITORY = ("aws:ecr/repository:Repository",)
LOG_GROUP = ("aws:cloudwatch/logGroup:LogGroup",)
SECRET_POLICY = ("aws:secretsmanager/secretPolicy:SecretPolicy",)
ECR_REPOSITORY_POLICY = ("aws:ecr/repositoryPolicy:RepositoryPolicy",)


def check_kms_rotation(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # Only symmetric encryption keys can rotate automatically.
    symmetric = get(props, "customerMasterKeySpec", default="SYMMETRIC_DEFAULT") == "SYMMETRIC_DEFAULT"
    encrypts = get(props, "keyUsage", default="ENCRYPT_DECRYPT") == "ENCRYPT_DECRYPT"
    if symmetric and encrypts and not truthy(get(props, "enableKeyRotation")):
        yield "KMS key without automatic rotation: set enable_key_rotation=True"


def check_secret_kms(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not get(props, "kmsKeyId"):
        yield "secret is encrypted with the AWS managed key; use the stack's KMS key (kms_key_id)"


def check_ecr_immutable(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    mutability = get(props, "imageTagMutability", default="MUTABLE")
    if mutability != "IMMUTABLE":
        yield f"ECR repository with imageTagMutability = {mutability!r}: releases are deployed by digest; use IMMUTABLE"


def check_ecr_scan(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not truthy(get(props, "imageScanningConfiguration", "scanOnPush")):
        yield "ECR repository does not scan images on push"


def check_log_group(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not get(props, "kmsKeyId"):
        yield "log group is not encrypted with a KMS key"
    if not as_int(get(props, "retentionInDays", default=0)):
        yield "log group keeps logs forever; set retention_in_days"


# --- a bucket and the resources that configure it --------------------------------------------------


def _bucket_keys(bucket: PolicyResource) -> set[str]:
    """What a configuration resource's ``bucket`` property may hold: the bucket's name or id."""
    return {str(v) for v in (get(bucket.props, "bucket"), get(bucket.props, "id")) if v}


def _configs(
    resources: Sequence[PolicyResource], types: Sequence[str], bucket: PolicyResource
) -> list[PolicyResource]:
    keys = _bucket_keys(bucket)
    return [r for r in of_type(resources, types) if str(get(r.props, "bucket", default="")) in keys]


def _purpose(bucket: PolicyResource) -> str:
    return str(get(tags_of(bucket.props), PURPOSE_TAG, default=""))


def _sse_algorithms(resources: Sequence[PolicyResource], bucket: PolicyResource) -> set[str]:
    rules = [
        rule
        for config in _configs(resources, BUCKET_SSE, bucket)
        for rule in as_list(get(config.props, "rules"))
    ]
    rules += as_list(get(bucket.props, "serverSideEncryptionConfiguration", "rule"))
    return {
        str(get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm", default="")) for rule in rules
    } - {""}


def check_s3_encryption(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for bucket in of_type(resources, BUCKET):
        algorithms = _sse_algorithms(resources, bucket)
        if not algorithms:
            yield bucket, "bucket has no default encryption configuration"
        elif _purpose(bucket) in KMS_PURPOSES and not algorithms <= {"aws:kms", "aws:kms:dsse"}:
            yield (
                bucket,
                f"{_purpose(bucket)} bucket is encrypted with {sorted(algorithms)}, not the stack's KMS key",
            )


def check_s3_versioning(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for bucket in of_type(resources, BUCKET):
        if _purpose(bucket) not in VERSIONED_PURPOSES:
            continue
        statuses = [
            get(c.props, "versioningConfiguration", "status")
            for c in _configs(resources, BUCKET_VERSIONING, bucket)
        ]
        if "Enabled" not in statuses and not truthy(get(bucket.props, "versioning", "enabled")):
            yield (
                bucket,
                f"{_purpose(bucket)} bucket is not versioned: an overwrite or delete would lose data",
            )


def check_s3_public_access(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket in of_type(resources, BUCKET):
        blocks = _configs(resources, BUCKET_PUBLIC_ACCESS_BLOCK, bucket)
        if not any(all(truthy(get(b.props, flag)) for flag in flags) for b in blocks):
            yield bucket, "bucket does not block public access (all four public access block settings)"


def _denies_insecure_transport(document: Mapping[str, Any]) -> bool:
    for statement in statements(document):
        condition = get(statement, "Condition", "Bool", "aws:SecureTransport")
        if get(statement, "Effect") == "Deny" and str(condition).lower() == "false":
            return True
    return False


def check_s3_tls_only(resources: Sequence[PolicyResource]) -> Iterator[tuple[PolicyResource, str]]:
    for bucket in of_type(resources, BUCKET):
        documents = [
            policy_document(get(p.props, "policy")) for p in _configs(resources, BUCKET_POLICY, bucket)
        ]
        documents.append(policy_document(get(bucket.props, "policy")))
        if not any(_denies_insecure_transport(d) for d in documents):
            yield bucket, "bucket policy does not deny requests without TLS (aws:SecureTransport = false)"


POLICIES = [
    resource_policy("kms-key-rotation", "KMS keys rotate automatically.", KMS_KEY, check_kms_rotation),
    resource_policy(
        "secrets-use-kms", "Secrets are encrypted with a customer managed KMS key.", SECRET, check_secret_kms
    ),
    resource_policy(
        "ecr-immutable-tags", "ECR repositories have immutable tags.", ECR_REPOSITORY, check_ecr_immutable
    ),
    resource_policy(
        "ecr-scan-on-push",
        "ECR repositories scan every pushed image.",
        ECR_REPOSITORY,
        check_ecr_scan,
        EnforcementLevel.ADVISORY,
    ),
    resource_policy(
        "log-groups-encrypted-with-retention",
        "Log groups use a KMS key and a retention period.",
        LOG_GROUP,
        check_log_group,
        EnforcementLevel.ADVISORY,
    ),
    stack_policy(
        "s3-encrypted", "Buckets are encrypted by default; weights and history with KMS.", check_s3_encryption
    ),
    stack_policy("s3-weights-versioned", "Weights and history buckets are versioned.", check_s3_versioning),
    stack_policy(
        "s3-public-access-blocked", "Buckets block every form of public access.", check_s3_public_access
    ),
    stack_policy("s3-tls-only", "Bucket policies refuse requests without TLS.", check_s3_tls_only),
]
