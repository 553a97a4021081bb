"""The pods' logs on a ``kubernetes`` stack: the log groups EC2's hosts write to, made here for the
pods' shipper (:mod:`frontier.targets.kubernetes.logging`), and the shipper's IAM role.

The groups have EC2's names (:func:`frontier.targets.kubernetes.logging.shipped_groups`), its
retention (:func:`infra.foundation.retention_days`) and its encryption (the stack's key, whose policy
lets CloudWatch Logs use it for the stack's groups). The role may create streams, put events and
describe streams in exactly those groups; its service account (``frontier-logging/frontier-fluent-bit``)
assumes it through EKS Pod Identity or IRSA, as each pool's pods assume theirs
(:mod:`infra.workload_identity`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.config.schema import Settings
from frontier.identity.cloud import Cloud
from frontier.identity.documents import log_shipper_policy
from frontier.targets.kubernetes.logging import LOGGING_NAMESPACE, SHIPPER_SERVICE_ACCOUNT, shipped_groups
from infra.workload_identity import service_account_trust


@dataclass(frozen=True)
class PodLogsArgs:
    settings: Settings
    cloud: Cloud
    cluster_name: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    retention_days: int
    tags: Mapping[str, str]
    #: IRSA: the cluster's OIDC provider (one another service account's role made) and its issuer.
    oidc_provider_arn: pulumi.Input[str] | None = None
    oidc_issuer: pulumi.Input[str] | None = None


class PodLogs(pulumi.ComponentResource):
    role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: PodLogsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:kubernetes:PodLogs", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        settings, tags = args.settings, dict(args.tags)
        groups = shipped_groups(settings)
        self.log_groups = [
            aws.cloudwatch.LogGroup(
                f"{name}-{group.rsplit('/', 1)[-1]}",
                name=group,
                retention_in_days=args.retention_days,
                kms_key_id=args.kms_key_arn,
                tags=tags,
                opts=child,
            )
            for group in groups
        ]
        identity = settings.kubernetes.identity if settings.kubernetes is not None else "pod_identity"
        if identity == "irsa" and (args.oidc_provider_arn is None or not args.oidc_issuer):
            raise ValueError(
                "kubernetes.identity = 'irsa': the log shipper's role needs the cluster's OIDC provider, "
                "which only a cluster this stack creates has here; use 'pod_identity' on an existing cluster"
            )
        role = aws.iam.Role(
            f"{name}-shipper",
            description=f"Frontier {settings.stack}: pod log shipper ({LOGGING_NAMESPACE}/{SHIPPER_SERVICE_ACCOUNT})",
            assume_role_policy=service_account_trust(
                identity, LOGGING_NAMESPACE, SHIPPER_SERVICE_ACCOUNT, args.oidc_provider_arn, args.oidc_issuer
            ),
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-shipper",
            role=role.id,
            policy=json.dumps(log_shipper_policy(args.cloud, groups)),
            # The groups exist before anything may write to them.
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.log_groups)),
        )
        if identity == "pod_identity":
            aws.eks.PodIdentityAssociation(
                f"{name}-shipper",
                cluster_name=args.cluster_name,
                namespace=LOGGING_NAMESPACE,
                service_account=SHIPPER_SERVICE_ACCOUNT,
                role_arn=role.arn,
                tags=tags,
                opts=child,
            )
        self.role_arn = role.arn
        self.register_outputs({"role_arn": role.arn, "log_groups": groups})
