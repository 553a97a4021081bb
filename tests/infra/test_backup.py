"""The backup copy (infra/backup.py): a production stack's history replicated to its backup region,
deletions left behind, the copy private and encrypted there, the secret replicated, and a replication
role that can do nothing else. Under the engine's mocks; the prod program as the language host runs
it is tests/infra/test_language_host.py's (which this graph must equal)."""

from __future__ import annotations

import json

from infra_mocks import ACCOUNT_ID

from frontier.release.restore import backup_bucket_name

BUCKET = "aws:s3/bucket:Bucket"
REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
PROVIDER = "pulumi:providers:aws"


def purpose_bucket(graph, purpose):
    [found] = [b for b in graph.of_type(BUCKET) if b.inputs["tags"]["frontier:purpose"] == purpose]
    return found


def test_production_history_replicates_whole_to_the_backup_region_without_deletions(prod):
    history = purpose_bucket(prod, "history")
    backup = purpose_bucket(prod, "history-backup")
    [config] = [c for c in prod.of_type(REPLICATION) if c.inputs["bucket"] == history.outputs["bucket"]]
    [rule] = config.inputs["rules"]
    assert rule["status"] == "Enabled" and rule["filter"] == {"prefix": ""}
    assert rule["deleteMarkerReplication"] == {"status": "Disabled"}
    assert rule["destination"]["bucket"] == backup.outputs["arn"]
    assert rule["sourceSelectionCriteria"] == {"sseKmsEncryptedObjects": {"status": "Enabled"}}


def test_the_backup_bucket_is_named_as_fab_restore_finds_it_in_the_backup_region(prod):
    history = purpose_bucket(prod, "history").inputs["bucket"]
    backup = purpose_bucket(prod, "history-backup")
    assert backup.inputs["bucket"] == backup_bucket_name(history, "us-east-1", prod.settings.backup.region)
    provider = prod.one(PROVIDER, "prod-backup-region")
    assert provider.inputs["region"] == "us-west-2"
    assert "frontier:backup:Backup" in backup.parent_types


def test_the_backup_copy_is_versioned_encrypted_with_its_own_key_and_private(prod):
    backup = purpose_bucket(prod, "history-backup")
    name = backup.outputs["bucket"]

    def config(kind):
        [found] = [c for c in prod.of_type(f"aws:s3/bucket{kind}:Bucket{kind}") if c.inputs["bucket"] == name]
        return found.inputs

    assert config("Versioning")["versioningConfiguration"] == {"status": "Enabled"}
    [rule] = config("ServerSideEncryptionConfiguration")["rules"]
    key = prod.one("aws:kms/key:Key", "prod-backup-key")
    assert rule["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"] == key.outputs["arn"]
    assert key.inputs["enableKeyRotation"] is True
    assert config("PublicAccessBlock")["restrictPublicBuckets"] is True
    # Protected as the rest of a production stack's data: inherited from its component.
    assert backup.options is not None and backup.options.parent._protect


def test_the_api_keys_secret_has_a_replica_under_the_backup_key(prod):
    secret = prod.one("aws:secretsmanager/secret:Secret")
    key = prod.one("aws:kms/key:Key", "prod-backup-key")
    assert secret.inputs["replicas"] == [{"region": "us-west-2", "kmsKeyId": key.outputs["arn"]}]


def test_the_replication_role_only_replicates(prod):
    role = prod.one("aws:iam/role:Role", "prod-backup-replication")
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "s3.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT_ID}}
    policy = json.loads(prod.one("aws:iam/rolePolicy:RolePolicy", "prod-backup-replication").inputs["policy"])
    actions = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert actions == {
        "s3:GetReplicationConfiguration",
        "s3:ListBucket",
        "s3:GetObjectVersionForReplication",
        "s3:GetObjectVersionAcl",
        "s3:GetObjectVersionTagging",
        "s3:ReplicateObject",
        "s3:ReplicateTags",
        "kms:Decrypt",
        "kms:Encrypt",
        "kms:GenerateDataKey",
    }
    assert "s3:ReplicateDelete" not in actions  # deletions never reach the copy
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert by_sid["DecryptTheSourceViaS3"]["Condition"] == {
        "StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}
    }
    assert by_sid["EncryptTheReplicaViaS3"]["Condition"] == {
        "StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}
    }
    assert "*" not in json.dumps([s["Resource"] for s in policy["Statement"]]).replace("/*", "")


def test_a_stack_without_backup_region_makes_no_copy(dev):
    assert dev.settings.backup.region == ""
    assert dev.of_type(REPLICATION) == []
    assert not [r for r in dev.of_type(PROVIDER) if r.name == "dev-backup-region"]


def test_the_deploy_role_reads_the_backup_copy_of_its_history_alone_and_decrypts_only_via_s3(prod):
    document = json.loads(prod.one("aws:iam/rolePolicy:RolePolicy", "prod-iam-deploy").inputs["policy"])
    granted = {s["Sid"]: s for s in document["Statement"]}
    backup = purpose_bucket(prod, "history-backup").outputs["arn"]
    assert granted["ListTheBackupCopy"]["Action"] == "s3:ListBucketVersions"
    assert granted["ListTheBackupCopy"]["Resource"] == backup
    assert granted["ListTheBackupCopy"]["Condition"] == {
        "StringLike": {"s3:prefix": ["history/prod", "history/prod/*"]}
    }
    assert granted["ReadTheBackupCopy"]["Action"] == "s3:GetObjectVersion"
    assert granted["ReadTheBackupCopy"]["Resource"] == f"{backup}/history/prod/*"
    decrypt = granted["DecryptTheBackupCopy"]
    assert decrypt["Action"] == "kms:Decrypt"
    assert decrypt["Resource"] == f"arn:aws:kms:us-west-2:{ACCOUNT_ID}:key/*"
    alias = prod.one("aws:kms/alias:Alias", "prod-backup-key").inputs["name"]
    assert decrypt["Condition"] == {
        "ForAnyValue:StringEquals": {"kms:ResourceAliases": alias},
        "StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"},
    }


def test_a_stack_without_a_backup_copy_grants_no_reading_of_one(dev):
    document = json.loads(dev.one("aws:iam/rolePolicy:RolePolicy", "dev-iam-deploy").inputs["policy"])
    assert not {s["Sid"] for s in document["Statement"]} & {
        "ListTheBackupCopy",
        "ReadTheBackupCopy",
        "DecryptTheBackupCopy",
    }
