"""IAM for a ``kubernetes`` stack: the runtime pods' role and the role ``fab`` deploys with.

Each pool's pods have a service account and a runtime role of their own, carrying the EC2 hosts'
least-privilege policy for that pool (:func:`frontier.identity.documents.runtime_pod_policy`: its
pool's weights prefix, its API-keys secret, the key only via S3 and Secrets Manager, its logs and
metrics), assumed by that service account instead of an instance: through EKS Pod Identity (an
association of namespace and service account to the role) or IRSA (the cluster's OIDC provider, the
trust pinned to that service account). Image pulls are the kubelet's, through the node role.

The deploy role keeps the EC2 deploy role's history, weights and image statements; instead of
draining target groups it may describe its own cluster (Kubernetes access itself comes from an
EKS access entry scoped to the runtime's namespace, see :mod:`infra.eks`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from frontier.config.schema import PoolSettings
from frontier.identity.documents import DEPLOY_SESSION_S, kubernetes_deploy_policy, runtime_pod_policy, trust
from infra.identity import IdentityInputs, rendered

POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
# Pod Identity trust: the agent assumes the role and tags the session with the pod's identity.
POD_IDENTITY_ACTIONS = ["sts:AssumeRole", "sts:TagSession"]


@dataclass(frozen=True)
class WorkloadIdentityArgs:
    identity: IdentityInputs
    #: The pool whose pods run as this role (its weights, secret and history only).
    pool: PoolSettings
    mode: str  # "pod_identity" | "irsa"
    namespace: str
    #: The pool's own service account (frontier.targets.kubernetes.manifests.pool_service_account).
    service_account: str
    cluster_name: pulumi.Input[str]
    oidc_issuer: pulumi.Input[str]
    tags: Mapping[str, str]
    #: An existing cluster's role for the runtime (``kubernetes.runtime_role_arn``): none is made.
    role_arn: str = ""
    #: IRSA on a created cluster: the OIDC provider another pool's identity made; one is made if None.
    oidc_provider_arn: pulumi.Input[str] | None = None


def pod_identity_trust() -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": POD_IDENTITY_PRINCIPAL},
                    "Action": POD_IDENTITY_ACTIONS,
                }
            ],
        }
    )


def irsa_trust(provider_arn: str, issuer: str, namespace: str, service_account: str) -> str:
    host = issuer.removeprefix("https://")
    statement = {
        "Effect": "Allow",
        "Principal": {"Federated": provider_arn},
        "Action": "sts:AssumeRoleWithWebIdentity",
        "Condition": {
            "StringEquals": {
                f"{host}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                f"{host}:aud": "sts.amazonaws.com",
            }
        },
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


def service_account_trust(
    mode: str,
    namespace: str,
    service_account: str,
    oidc_provider_arn: pulumi.Input[str] | None,
    oidc_issuer: pulumi.Input[str] | None,
) -> pulumi.Output[str]:
    """Who may assume the role of ``namespace/service_account``: with IRSA (``mode``), that service
    account alone, through the cluster's OIDC provider; with EKS Pod Identity, the Pod Identity agent
    (the role's association names the service account whose pods it serves)."""
    if mode == "irsa":
        assert oidc_provider_arn is not None and oidc_issuer is not None
        return pulumi.Output.all(oidc_provider_arn, oidc_issuer).apply(
            lambda a: irsa_trust(a[0], a[1], namespace, service_account)
        )
    return pulumi.Output.from_input(pod_identity_trust())


class KubernetesDeployRole(pulumi.ComponentResource):
    """Made before the cluster: the cluster's access entry names it."""

    arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: IdentityInputs, cluster_arn: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:kubernetes:DeployRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        deploy = aws.iam.Role(
            f"{name}-deploy",
            description=f"Frontier {args.stack}: fab deploy, rollback, weights and image push",
            assume_role_policy=trust({"AWS": args.cloud.account_root}),
            max_session_duration=DEPLOY_SESSION_S,
            tags=dict(args.tags),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-deploy",
            role=deploy.id,
            policy=rendered(args.for_stack(), lambda a: kubernetes_deploy_policy(a, cluster_arn)),
            opts=child,
        )
        self.arn = deploy.arn
        self.register_outputs({"arn": deploy.arn})


class WorkloadIdentity(pulumi.ComponentResource):
    runtime_role_arn: pulumi.Output[str]
    #: IRSA on a created cluster: its OIDC provider, which other service accounts' roles trust too.
    oidc_provider_arn: pulumi.Output[str] | None = None

    def __init__(
        self, name: str, args: WorkloadIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:kubernetes:WorkloadIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags, base = dict(args.tags), args.identity
        if args.role_arn:
            self.runtime_role_arn = pulumi.Output.from_input(args.role_arn)
            if args.mode == "pod_identity":
                self._associate(name, args, args.role_arn, tags)
            self.register_outputs({"runtime_role_arn": args.role_arn})
            return

        if args.mode == "irsa":
            if args.oidc_provider_arn is None:
                provider = aws.iam.OpenIdConnectProvider(
                    f"{name}-oidc",
                    url=args.oidc_issuer,
                    client_id_lists=["sts.amazonaws.com"],
                    tags=tags,
                    opts=child,
                )
                self.oidc_provider_arn = provider.arn
            else:
                self.oidc_provider_arn = pulumi.Output.from_input(args.oidc_provider_arn)
        runtime = aws.iam.Role(
            f"{name}-runtime",
            description=f"Frontier {base.stack}: runtime pods of {args.pool.name} ({args.namespace}/{args.service_account})",
            assume_role_policy=service_account_trust(
                args.mode, args.namespace, args.service_account, self.oidc_provider_arn, args.oidc_issuer
            ),
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-runtime",
            role=runtime.id,
            policy=rendered(base.for_pool(args.pool), runtime_pod_policy),
            opts=child,
        )
        if args.mode == "pod_identity":
            self._associate(name, args, runtime.arn, tags)
        self.runtime_role_arn = runtime.arn
        self.register_outputs({"runtime_role_arn": runtime.arn})

    def _associate(
        self, name: str, args: WorkloadIdentityArgs, role_arn: pulumi.Input[str], tags: dict[str, str]
    ) -> None:
        """EKS Pod Identity: the runtime's service account gets the role's credentials."""
        aws.eks.PodIdentityAssociation(
            f"{name}-runtime",
            cluster_name=args.cluster_name,
            namespace=args.namespace,
            service_account=args.service_account,
            role_arn=role_arn,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
