"""The stack's release key: an asymmetric KMS key (ECC_NIST_P256, SIGN_VERIFY) that signs releases.

``fab deploy`` signs each release's statement with it (``kms:Sign``, the deploy role's alone among
the stack's principals: :func:`frontier.identity.documents.deploy_policy`); a host reads its public
key (``kms:GetPublicKey``) when it is provisioned and, from then on, stages and activates only
releases it verifies (:mod:`frontier_hostside.release_signature`). The toolkit and the hosts find
it by its alias, :func:`frontier.release.signing.key_alias`; the stack exports its ARN
(``release_key_arn``).

Asymmetric keys cannot rotate automatically: a new key is a new alias target, and hosts read the
new public key when they are provisioned again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.release.signing import KEY_SPEC, KEY_USAGE, key_alias
from infra.cloud import Cloud
from infra.secret_store import account_administers_through_iam


def release_key_policy(cloud: Cloud) -> str:
    """The account administers and uses the key through IAM: the stack's documents decide who signs."""
    return json.dumps({"Version": "2012-10-17", "Statement": [account_administers_through_iam(cloud)]})


@dataclass(frozen=True)
class ReleaseKeyArgs:
    stack: str
    cloud: Cloud
    tags: Mapping[str, str]


class ReleaseKey(pulumi.ComponentResource):
    arn: pulumi.Output[str]
    key_id: pulumi.Output[str]

    def __init__(self, name: str, args: ReleaseKeyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:release:ReleaseKey", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        key = aws.kms.Key(
            f"{name}-key",
            description=f"Frontier {args.stack}: signs releases; hosts run only what it signed",
            key_usage=KEY_USAGE,
            customer_master_key_spec=KEY_SPEC,
            deletion_window_in_days=30,
            policy=release_key_policy(args.cloud),
            tags=dict(args.tags),
            opts=child,
        )
        aws.kms.Alias(f"{name}-alias", name=key_alias(args.stack), target_key_id=key.key_id, opts=child)
        self.arn = key.arn
        self.key_id = key.key_id
        self.register_outputs({"arn": self.arn})
