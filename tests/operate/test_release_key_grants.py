"""Who may use the release key, proven by enforcement: moto's server checks every call against the
documents :mod:`frontier.identity` renders (as the local stack makes its users), and only the deploy
role signs. A host reads the public key and nothing more."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import boto3
import pytest
from botocore.exceptions import ClientError

from frontier.release.artifact import Artifact
from frontier.release.release import Release
from frontier.release.signing import ReleaseKey, check_release, find_release_key, key_alias, sign_release
from frontier.targets import load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import iam, services


@dataclass
class Account:
    endpoint: str
    keys: dict[str, iam.AccessKey]
    documents: dict
    key: ReleaseKey

    def kms(self, actor: str):  # noqa: ANN201 - a boto3 client
        return boto3.client(
            "kms", endpoint_url=self.endpoint, region_name="us-east-1", **self.keys[actor].boto3_kwargs()
        )


@pytest.fixture(scope="module")
def account(tmp_path_factory):
    settings = load_stack("local")
    state = tmp_path_factory.mktemp("state")
    moto = services.start_moto(0, state / "moto", env=iam.MOTO_ENV)
    bucket, prefix = local.history_bucket(settings), local.history_prefix(settings)
    try:
        _, keys = iam.provision(settings, moto.endpoint, state, bucket, prefix, fresh=True)
        recorded = json.loads((state / iam.RELEASE_KEY_FILE).read_text())["arn"]
        documents = iam.documents(settings, bucket, prefix, release_key=recorded)
        admin = boto3.client(
            "kms", endpoint_url=moto.endpoint, region_name="us-east-1", **keys["admin"].boto3_kwargs()
        )
        key = find_release_key(admin, settings.stack)
        assert key is not None
        yield Account(moto.endpoint, keys, documents, key)
    finally:
        services.stop(moto)


def a_release() -> Release:
    return Release(
        Artifact("sha256:" + hashlib.sha256(b"runtime").hexdigest(), "image"), {"runtime.yaml": "x\n"}
    )


def test_the_deploy_role_signs_a_release_that_the_public_key_verifies(account):
    signed = sign_release(account.kms("deploy"), account.key, "local", a_release())
    check_release(account.key, "local", signed)


def test_a_host_cannot_sign_a_release(account):
    with pytest.raises(ClientError) as refused:
        account.kms("host").sign(
            KeyId=account.key.arn, Message=b"x", MessageType="RAW", SigningAlgorithm="ECDSA_SHA_256"
        )
    assert "AccessDenied" in str(refused.value) and "kms:Sign" in str(refused.value)


def test_a_host_reads_the_public_key_as_its_bootstrap_does(account):
    found = find_release_key(account.kms("host"), "local")
    assert found is not None and found.public_key == account.key.public_key


def test_the_deploy_document_alone_grants_kms_sign_and_names_the_key(account):
    granted = {
        (actor, statement["Sid"])
        for actor, policies in account.documents.items()
        if actor != "admin"
        for document in policies.values()
        for statement in document["Statement"]
        if "kms:Sign"
        in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    }
    assert granted == {("deploy", "SignReleases")}
    [sign] = [s for s in account.documents["deploy"]["deploy"]["Statement"] if s["Sid"] == "SignReleases"]
    key_arn = account.kms("admin").describe_key(KeyId=key_alias("local"))["KeyMetadata"]["Arn"]
    assert sign["Resource"] == key_arn


def test_the_host_document_grants_the_public_key_and_verify_only(account):
    [read] = [
        s
        for document in account.documents["host"].values()
        for s in document["Statement"]
        if s["Sid"] == "ReadTheReleaseKey"
    ]
    assert sorted(read["Action"]) == ["kms:GetPublicKey", "kms:Verify"]


def test_a_cloud_hosts_bootstrap_writes_the_public_key_through_the_aws_cli_as_its_host_role(
    account, tmp_path, monkeypatch
):
    """What ``frontier-bootstrap.py boot`` does before it stages anything (the real AWS CLI)."""
    from frontier_hostside import node_boot
    from frontier_hostside.aws_cli import Aws
    from frontier_hostside.release_signature import RELEASE_KEY_NAME

    from tests.aws_host import aws_cli

    for key, value in {"AWS_ENDPOINT_URL": account.endpoint, **account.keys["host"].env()}.items():
        monkeypatch.setenv(key, value)
    config = node_boot.NodeConfig(
        stack="local", node_group="g", region="us-east-1", history_bucket="b", history_prefix="p/",
        root=str(tmp_path), launch_hook="", terminate_hook="", metrics_url="", namespace="",
        queue_metric="", running_metric="", latency_metric="", waiting_series="", running_series="",
        e2e_series="", readiness_timeout_s=1.0,
    )  # fmt: skip
    assert node_boot.install_release_key(Aws("us-east-1", aws_cli()), config)
    assert (tmp_path / RELEASE_KEY_NAME).read_text().strip() == account.key.public_key
    # A stack with no release key: nothing is written, and the host says so.
    other = node_boot.NodeConfig(**{**config.__dict__, "stack": "no-key-stack", "root": str(tmp_path / "o")})
    assert not node_boot.install_release_key(Aws("us-east-1", aws_cli()), other)


def test_the_local_release_key_holds_the_policy_that_lets_the_deploy_user_alone_sign(account):
    """moto stores the key policy but evaluates none on kms:Sign (moto/kms/policy_validator.py checks
    an unconditional Deny of DescribeKey only): on moto the admin, whose document allows kms:*,
    would sign. So the policy moto holds is evaluated as AWS would, with each user's documents."""
    from frontier.identity.key_policies import release_key_policy
    from tests.e2e.iam_simulation import Call, principal_arn, simulate

    settings = load_stack("local")
    arn = account.kms("admin").describe_key(KeyId=key_alias("local"))["KeyMetadata"]["Arn"]
    held = json.loads(account.kms("admin").get_key_policy(KeyId=arn, PolicyName="default")["Policy"])
    assert held == json.loads(release_key_policy(iam._cloud(settings), principal_arn(settings, "deploy")))
    documents = {
        principal_arn(settings, actor): [
            {"name": name, "policy": document} for name, document in policies.items()
        ]
        for actor, policies in account.documents.items()
    }
    actors = ("deploy", "admin", "host")
    calls = [Call(principal_arn(settings, a), "kms:Sign", arn, (), "Sign") for a in actors]
    found = simulate({"all": documents}, calls, {arn: held})["all"]
    decided = [d["decision"] for d in found]
    assert dict(zip(actors, decided, strict=True)) == {
        "deploy": "Allowed",
        "admin": "ExplicitlyDenied",
        "host": "ExplicitlyDenied",
    }
