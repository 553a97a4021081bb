"""Signing a release with the stack's release key (KMS, asymmetric, ECC_NIST_P256, SIGN_VERIFY).

The key is the Foundation's (``infra/foundation.py``), known by its alias
``alias/frontier-<stack>-release`` (:func:`key_alias`), so the toolkit and the Pulumi program name
it alike; only the deploy role may ``kms:Sign`` with it, hosts may read its public key. What is
signed is :func:`frontier_hostside.release_signature.statement`: the stack, the release id and the
sha256 of ``release.json`` (artifact digest, rendered files' hashes, the SBOM's digest where one
was made). Hosts check it offline with the public key in their agent configuration before
``current`` moves (``frontier_hostside.agent``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from frontier_hostside.release_signature import (
    ALGORITHM,
    ReleaseSignature,
    SignatureError,
    release_key_alias,
    statement,
    verify_release,
)

from frontier.errors import FrontierError
from frontier.release.release import Release

KEY_SPEC = "ECC_NIST_P256"
KEY_USAGE = "SIGN_VERIFY"


class SigningError(FrontierError):
    """A release that cannot be signed, or whose signature does not hold."""


def key_alias(stack: str) -> str:
    """The alias of ``stack``'s release key, as the Foundation creates it."""
    return release_key_alias(stack)


@dataclass(frozen=True)
class ReleaseKey:
    """The stack's release key: its ARN (what signs) and its public key (what hosts check with)."""

    arn: str
    public_key: str  # base64 DER SubjectPublicKeyInfo, as GetPublicKey returns it


def find_release_key(kms: Any, stack: str) -> ReleaseKey | None:
    """The stack's release key, or None where the stack has none (its alias does not exist). One
    call, kms:GetPublicKey: all a host's role and the deploy role are granted besides signing."""
    try:
        answer = kms.get_public_key(KeyId=key_alias(stack))
    except kms.exceptions.NotFoundException:
        return None
    except kms.exceptions.UnsupportedOperationException as exc:  # a symmetric key has no public half
        raise SigningError(
            f"{key_alias(stack)} is no release key ({exc}); it must be {KEY_SPEC} {KEY_USAGE}"
        ) from None
    # KMS answers KeySpec and its deprecated twin CustomerMasterKeySpec; moto the second only.
    spec = answer.get("KeySpec") or answer.get("CustomerMasterKeySpec")
    if spec != KEY_SPEC or answer.get("KeyUsage") != KEY_USAGE:
        raise SigningError(
            f"{key_alias(stack)} is a {spec} {answer.get('KeyUsage')} key; "
            f"a release key must be {KEY_SPEC} {KEY_USAGE}"
        )
    return ReleaseKey(arn=str(answer["KeyId"]), public_key=base64.b64encode(answer["PublicKey"]).decode())


def create_release_key(kms: Any, stack: str) -> ReleaseKey:
    """The stack's release key, made with its alias where it does not exist (the local stack's
    ``local.up`` stands in for the Foundation with this), named by its full ARN."""
    if find_release_key(kms, stack) is None:
        made = kms.create_key(
            KeySpec=KEY_SPEC,
            KeyUsage=KEY_USAGE,
            Description=f"Frontier {stack}: signs releases; hosts run only what it signed",
            Tags=[{"TagKey": "frontier:stack", "TagValue": stack}],
        )["KeyMetadata"]
        kms.create_alias(AliasName=key_alias(stack), TargetKeyId=made["KeyId"])
    key = find_release_key(kms, stack)
    assert key is not None
    arn = str(kms.describe_key(KeyId=key_alias(stack))["KeyMetadata"]["Arn"])
    return ReleaseKey(arn=arn, public_key=key.public_key)


def sign_release(kms: Any, key: ReleaseKey, stack: str, release: Release) -> Release:
    """``release`` with its signature (``release.sig``): KMS signs its statement with the key."""
    message = statement(stack, release.id, release.manifest().encode())
    try:
        answer = kms.sign(KeyId=key.arn, Message=message, MessageType="RAW", SigningAlgorithm=ALGORITHM)
    except Exception as exc:  # botocore's ClientError and moto's refusals alike
        raise SigningError(f"release {release.id}: kms:Sign with {key.arn} failed: {exc}") from exc
    signature = ReleaseSignature(
        key_id=str(answer["KeyId"]), algorithm=ALGORITHM, signature=answer["Signature"]
    )
    return release.signed(signature.to_json())


def check_release(key: ReleaseKey, stack: str, release: Release) -> None:
    """Raise :class:`SigningError` unless ``release`` carries a signature of ``key`` over its files."""
    if not release.signature:
        raise SigningError(f"release {release.id} is unsigned: stack {stack} runs only signed releases")
    try:
        verify_release(key.public_key, stack, release.id, release.manifest().encode(), release.signature)
    except SignatureError as exc:
        raise SigningError(str(exc)) from None
