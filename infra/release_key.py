"""The stack's release key: an asymmetric KMS key (ECC_NIST_P256, SIGN_VERIFY) that signs releases.

``fab deploy`` signs each release's statement with it (``kms:Sign``, the deploy role's alone: its
document grants it, :func:`frontier.identity.documents.deploy_policy`, and the key's policy refuses it
to every other principal of the account, administrators included,
:func:`frontier.identity.key_policies.release_key_policy`); a host reads its public
key (``kms:GetPublicKey``) when it is provisioned and, from then on, stages and activates only
releases it verifies (:mod:`frontier_hostside.release_signature`). The toolkit and the hosts find
it by its alias, :func:`frontier.release.signing.key_alias`; the stack exports its ARN
(``release_key_arn``).

The key policy names the deploy role, which each target's program makes after the Foundation (the
EC2 one after the load balancer whose targets it drains): the key is made with KMS's default policy
(the account administers it through IAM, the same first statement) and its program hands it the role
with :meth:`ReleaseKey.signed_by`, which puts the full policy on it (``aws.kms.KeyPolicy``) once the
role exists, before any release can be built.

Asymmetric keys cannot rotate automatically: a new key is a new alias target, and hosts read the
new public key when they are provisioned again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.identity.key_policies import release_key_policy
from frontier.release.signing import KEY_SPEC, KEY_USAGE, key_alias
from infra.cloud import Cloud


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
        self._name, self._cloud = name, args.cloud
        child = pulumi.ResourceOptions(parent=self)
        key = aws.kms.Key(
            f"{name}-key",
            description=f"Frontier {args.stack}: signs releases; hosts run only what it signed",
            key_usage=KEY_USAGE,
            customer_master_key_spec=KEY_SPEC,
            deletion_window_in_days=30,
            # No policy here: signed_by's KeyPolicy holds it (the two would undo each other's).
            tags=dict(args.tags),
            opts=child,
        )
        aws.kms.Alias(f"{name}-alias", name=key_alias(args.stack), target_key_id=key.key_id, opts=child)
        self.arn = key.arn
        self.key_id = key.key_id
        self.register_outputs({"arn": self.arn})

    def signed_by(self, signer_arn: pulumi.Input[str]) -> aws.kms.KeyPolicy:
        """The key's policy, once ``signer_arn`` (the stack's deploy role) exists: that role alone signs."""
        return aws.kms.KeyPolicy(
            f"{self._name}-policy",
            key_id=self.key_id,
            policy=pulumi.Output.from_input(signer_arn).apply(lambda arn: release_key_policy(self._cloud, arn)),
            opts=pulumi.ResourceOptions(parent=self),
        )
