"""Hosts run only what the stack's release key signed: KMS (moto, in process) signs, the agent checks.

The key is a real asymmetric KMS key as moto makes it (ECC_NIST_P256, its private half in moto's
``cryptography``); the agent verifies offline, with the public key provisioning wrote to
``<root>/release-key.pub``, by its own pure-Python ECDSA. Nothing runs here: stage and activate
are file operations, so these stay in the quick tier.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import boto3
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from frontier_hostside.agent import Agent, AgentConfig, AgentError
from frontier_hostside.names import CURRENT_LINK
from frontier_hostside.release_signature import (
    RELEASE_KEY_NAME,
    SIGNATURE_NAME,
    SignatureError,
    ecdsa_p256_verify,
    public_key_point,
)
from moto import mock_aws

from frontier.release.artifact import Artifact
from frontier.release.release import MANIFEST, Release
from frontier.release.signing import (
    SigningError,
    check_release,
    create_release_key,
    find_release_key,
    key_alias,
    sign_release,
)
from frontier.render.host import render_agent_config
from frontier.targets import load_stack

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def kms():
    with mock_aws():
        yield boto3.client("kms", region_name="us-east-1")


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    settings = load_stack("local")
    root = tmp_path / "root"
    root.mkdir()
    text = render_agent_config(
        settings, settings.only_pool, host="h1", root=str(root), python=sys.executable, address="127.0.0.1"
    )
    return Agent(AgentConfig.from_dict(json.loads(text)))


def a_release(n: int) -> Release:
    return Release(
        artifact=Artifact(digest=DIGEST, kind="image", image=f"repo@{DIGEST}"),
        files={"runtime.yaml": f"model: m{n}\n", "frontier-runtime.service": "[Unit]\n"},
    )


def upload(tmp_path: Path, release: Release, name: str = "incoming") -> Path:
    """What HostSession.stage uploads: the files, release.sig where signed, release.json."""
    incoming = tmp_path / name
    incoming.mkdir()
    for file, text in release.files.items():
        (incoming / file).write_text(text)
    if release.signature:
        (incoming / SIGNATURE_NAME).write_text(release.signature)
    (incoming / MANIFEST).write_text(release.manifest())
    return incoming


def provision(agent: Agent, kms, stack: str = "local") -> None:
    key = create_release_key(kms, stack)
    (agent.root / RELEASE_KEY_NAME).write_text(key.public_key + "\n")


def test_a_release_signed_by_the_stacks_key_is_staged_and_activated(kms, agent, tmp_path):
    provision(agent, kms)
    release = sign_release(kms, create_release_key(kms, "local"), "local", a_release(1))
    agent.stage(release.id, str(upload(tmp_path, release)))
    assert agent.activate(release.id)["current"] == release.id


def test_an_unsigned_release_is_refused_at_stage_with_one_line(kms, agent, tmp_path):
    provision(agent, kms)
    release = a_release(1)
    with pytest.raises(AgentError) as refused:
        agent.stage(release.id, str(upload(tmp_path, release)))
    assert str(refused.value) == f"stage: release {release.id} is unsigned (release.sig is missing); refused"
    assert not (agent.releases_dir / release.id).exists()


def test_a_rendered_file_changed_after_signing_is_refused_even_with_its_manifest_rewritten(
    kms, agent, tmp_path
):
    provision(agent, kms)
    signed = sign_release(kms, create_release_key(kms, "local"), "local", a_release(1))
    # The tamperer rewrites runtime.yaml and release.json to match, and keeps the old signature.
    changed = Release(
        artifact=signed.artifact,
        files={**signed.files, "runtime.yaml": "model: evil\n"},
        signature=signed.signature,
    )
    incoming = upload(tmp_path, changed)
    with pytest.raises(AgentError, match="does not verify with stack local's release key") as refused:
        agent.stage(changed.id, str(incoming))
    assert "\n" not in str(refused.value)
    assert not (agent.releases_dir / changed.id).exists()


def test_a_release_signed_by_another_stacks_key_is_refused(kms, agent, tmp_path):
    provision(agent, kms, "local")
    other = sign_release(kms, create_release_key(kms, "dev"), "local", a_release(1))
    with pytest.raises(AgentError, match=r"stage: release r-[0-9a-f]{12}: release.sig does not verify"):
        agent.stage(other.id, str(upload(tmp_path, other)))


def test_a_staged_release_altered_on_the_host_is_refused_at_activate_and_current_stays(kms, agent, tmp_path):
    provision(agent, kms)
    key = create_release_key(kms, "local")
    old, new = (sign_release(kms, key, "local", a_release(n)) for n in (1, 2))
    for n, release in enumerate((old, new)):
        agent.stage(release.id, str(upload(tmp_path, release, f"in{n}")))
    agent.activate(old.id)
    (agent.releases_dir / new.id / "runtime.yaml").write_text("model: evil\n")
    with pytest.raises(AgentError, match=r"activate: runtime.yaml has sha256"):
        agent.activate(new.id)
    assert agent.link(CURRENT_LINK) == old.id


def test_a_signature_of_the_same_release_for_another_stack_is_refused(kms, agent, tmp_path):
    """The statement names the stack: one stack's signed release is not another's."""
    provision(agent, kms, "local")
    key = create_release_key(kms, "local")
    elsewhere = sign_release(kms, key, "dev", a_release(1))
    with pytest.raises(AgentError, match="does not verify"):
        agent.stage(elsewhere.id, str(upload(tmp_path, elsewhere)))


def test_a_host_with_no_release_key_holds_releases_to_their_manifest_only(agent, tmp_path):
    release = a_release(1)
    agent.stage(release.id, str(upload(tmp_path, release)))
    assert agent.activate(release.id)["current"] == release.id


def test_the_release_key_is_found_by_its_alias_and_is_an_ecc_sign_verify_key(kms):
    made = create_release_key(kms, "prod")
    meta = kms.describe_key(KeyId=key_alias("prod"))["KeyMetadata"]
    assert (meta["KeySpec"], meta["KeyUsage"]) == ("ECC_NIST_P256", "SIGN_VERIFY")
    found = find_release_key(kms, "prod")
    assert found is not None and found.public_key == made.public_key
    assert made.arn == meta["Arn"]  # the documents name the key by its ARN
    assert find_release_key(kms, "staging") is None
    assert create_release_key(kms, "prod") == made  # idempotent


def test_a_symmetric_key_under_the_alias_is_refused_naming_the_spec(kms):
    key = kms.create_key()["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=key_alias("prod"), TargetKeyId=key)
    with pytest.raises(
        SigningError, match="is a SYMMETRIC_DEFAULT .*key; a release key must be ECC_NIST_P256"
    ):
        find_release_key(kms, "prod")


def test_the_toolkit_check_refuses_unsigned_and_altered_releases(kms):
    key = create_release_key(kms, "local")
    signed = sign_release(kms, key, "local", a_release(1))
    check_release(key, "local", signed)
    with pytest.raises(SigningError, match="is unsigned"):
        check_release(key, "local", a_release(1))
    altered = Release(signed.artifact, {**signed.files, "runtime.yaml": "x\n"}, signature=signed.signature)
    with pytest.raises(SigningError, match="does not verify"):
        check_release(key, "local", altered)


def test_kms_signatures_verify_with_kms_itself_too(kms):
    """moto's own kms:Verify agrees with the agent's pure-Python check on the same bytes."""
    key = create_release_key(kms, "local")
    release = sign_release(kms, key, "local", a_release(3))
    signature = base64.b64decode(json.loads(release.signature)["signature"])
    from frontier_hostside.release_signature import statement

    message = statement("local", release.id, release.manifest().encode())
    answer = kms.verify(KeyId=key.arn, Message=message, Signature=signature, SigningAlgorithm="ECDSA_SHA_256")
    assert answer["SignatureValid"] is True
    assert ecdsa_p256_verify(public_key_point(key.public_key), message, signature)


def test_the_pure_python_verify_agrees_with_cryptography_on_good_and_bad_signatures():
    private = ec.generate_private_key(ec.SECP256R1())
    der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    point = public_key_point(base64.b64encode(der).decode())
    for n in range(20):
        message = f"message {n}".encode()
        signature = private.sign(message, ec.ECDSA(hashes.SHA256()))
        assert ecdsa_p256_verify(point, message, signature)
        assert not ecdsa_p256_verify(point, message + b"!", signature)
        flipped = bytearray(signature)
        flipped[-1] ^= 1
        assert not ecdsa_p256_verify(point, message, bytes(flipped))


def test_a_public_key_of_another_curve_is_refused():
    der = (
        ec.generate_private_key(ec.SECP384R1())
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(SignatureError, match="not an ECC_NIST_P256 key"):
        public_key_point(base64.b64encode(der).decode())
