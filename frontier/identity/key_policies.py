"""The key policies of a stack's KMS keys, as plain documents (the Pulumi program and the local stack
render the same ones).

A KMS key answers to its key policy first: an identity policy grants nothing on a key whose policy
does not let the account delegate to IAM. Both keys of a stack do (:func:`account_administers_through_iam`),
so the account's administrators manage them and the stack's documents decide who uses them. The
release key narrows that: whatever an identity policy grants, only the stack's signer (its deploy
role) may ``kms:Sign`` with it (:func:`release_key_policy`), so an account administrator whose own
policy says ``kms:*`` can administer the key (describe it, change its policy, schedule its deletion,
each a CloudTrail event) but cannot sign a release with it as it stands.
"""

from __future__ import annotations

import json

from frontier.identity.cloud import Cloud

ADMINISTERS_SID = "AccountAdministersThroughIam"
ONLY_SIGNER_SID = "OnlyTheDeployRoleSigns"


def account_administers_through_iam(cloud: Cloud) -> dict[str, object]:
    """The key statement without which a key is unmanageable: IAM policies in the account decide who uses it."""
    return {
        "Sid": ADMINISTERS_SID,
        "Effect": "Allow",
        "Principal": {"AWS": cloud.account_root},
        "Action": "kms:*",
        "Resource": "*",
    }


def only_signer(signer_arn: str) -> dict[str, object]:
    """Every principal but ``signer_arn`` is refused ``kms:Sign``, whatever its identity policy grants.

    ``aws:PrincipalArn`` is the role's ARN for every session of the role (not the session's ARN), and
    the user's ARN for a user; an explicit Deny in the key policy outranks any Allow.
    """
    if not signer_arn.startswith("arn:"):
        raise ValueError(f"release key signer: {signer_arn!r} is no ARN (expected arn:<partition>:iam::...)")
    return {
        "Sid": ONLY_SIGNER_SID,
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "kms:Sign",
        "Resource": "*",
        "Condition": {"ArnNotEquals": {"aws:PrincipalArn": signer_arn}},
    }


def release_key_policy(cloud: Cloud, signer_arn: str) -> str:
    """The release key's policy: the account administers it through IAM; ``signer_arn`` alone signs."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [account_administers_through_iam(cloud), only_signer(signer_arn)],
        }
    )
