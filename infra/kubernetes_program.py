"""The Pulumi program of a ``kubernetes`` stack: the same buckets, key, secret and registry as on EC2,
then either an EKS cluster with GPU node groups (``cluster: create``) or an existing cluster's
kubeconfig (``cluster: existing``), and the runtime's workloads on it — every model pool's, the
gateway's where the stack has one (with its own IAM role: :class:`GatewayIdentity`), and the
Prometheus stack's part (GPU exporter, resource alerts, alert routes, dashboard).

:func:`infra.program.build` hands a ``kubernetes`` stack here; everything follows from the settings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from frontier.config.checks import is_production
from frontier.config.schema import Kubernetes, Settings
from frontier.identity.gateway import secret_statements, tokenizer_arns, tokenizer_statements
from frontier.identity.pools import principal_suffix
from frontier.targets.kubernetes.gateway import GATEWAY_SERVICE_ACCOUNT
from frontier.targets.kubernetes.manifests import pool_service_account
from infra.addons import ClusterAddons, ClusterAddonsArgs, has_web_acl
from infra.cloud import Cloud, look_up
from infra.eks import EksArgs, EksCluster
from infra.foundation import Foundation, FoundationArgs, retention_days
from infra.interruptions import notice_queue
from infra.outputs import KubernetesOutputs
from infra.placement import GpuPlacement, look_up_placement, node_pool_problems, node_pool_zones
from infra.pod_logs import PodLogs, PodLogsArgs
from infra.preflight import certificate_problems, refuse_problems, registry_problems, weights_bucket_problems
from infra.storage import metering_problems
from infra.tags import base_tags
from infra.waf import StackWebAcl, WebAclArgs
from infra.workload_identity import (
    KubernetesDeployRole,
    WorkloadIdentity,
    WorkloadIdentityArgs,
    service_account_trust,
)
from infra.workloads import Workloads, WorkloadsArgs


def _k8s(settings: Settings) -> Kubernetes:
    return settings.section(Kubernetes)


def _problems(s: Settings, cloud: Cloud) -> Iterator[str]:
    k = _k8s(s)
    if k.ingress.kind == "alb":
        yield from certificate_problems(s, cloud)
    yield from registry_problems(s, cloud, "nodes")
    yield from weights_bucket_problems(s, cloud)
    yield from metering_problems(s, cloud)
    if k.cluster.mode == "create" and len(cloud.availability_zones) < 2:
        yield f"region {cloud.region}: EKS needs two availability zones for its control plane"
    if k.cluster.mode == "existing" and not os.path.exists(os.path.expanduser(k.cluster.kubeconfig)):
        yield f"kubernetes.cluster.kubeconfig = {k.cluster.kubeconfig!r}: no such file"


def gateway_pod_policy(settings: Settings, cloud: Cloud, kms_key_arn: str) -> dict[str, Any]:
    """What the gateway does with AWS, as on EC2 but without discovery (Services route here): read
    its tenants' key digests, every pool's runtime keys and a Redis quota store's secret, decrypt them,
    write metering under its prefix."""
    assert settings.gateway is not None
    quota_auth = settings.gateway.quota.redis_auth_secret  # a Redis quota store's AUTH token (and URL)
    secrets = sorted(
        {t.api_key_secret for t in settings.tenants if t.api_key_secret}
        | {p.runtime.api_keys_secret for p in settings.pools if p.runtime.api_keys_secret}
        | ({quota_auth} if quota_auth else set())
    )
    tokenizers = tokenizer_arns(settings, cloud.partition)
    # Secrets Manager decrypts its secrets for it; S3 the tokenizer objects it reads, where it routes
    # a pool by KV events (the weights bucket encrypts with the stack's key too).
    decrypt_via = [f"secretsmanager.{cloud.region}.{cloud.dns_suffix}"]
    if tokenizers:
        decrypt_via.append(f"s3.{cloud.region}.{cloud.dns_suffix}")
    via: str | list[str] = decrypt_via[0] if len(decrypt_via) == 1 else decrypt_via
    # Secrets Manager appends six random characters to a secret's name in its ARN.
    secret_arns = [cloud.arn("secretsmanager", f"secret:{name}-??????") for name in secrets]
    bucket, _, prefix = settings.gateway.metering.uri.removeprefix("s3://").partition("/")
    objects = (
        f"arn:{cloud.partition}:s3:::{bucket}/{prefix.strip('/')}/*"
        if prefix
        else f"arn:{cloud.partition}:s3:::{bucket}/*"
    )
    return {
        "Version": "2012-10-17",
        "Statement": [
            *secret_statements(secret_arns, kms_key_arn, via),
            {"Sid": "WriteMetering", "Effect": "Allow", "Action": "s3:PutObject", "Resource": objects},
            {
                # The stack's buckets encrypt with its key: a new object needs a data key, via S3 only.
                "Sid": "EncryptMetering",
                "Effect": "Allow",
                "Action": "kms:GenerateDataKey",
                "Resource": kms_key_arn,
                "Condition": {"StringEquals": {"kms:ViaService": f"s3.{cloud.region}.{cloud.dns_suffix}"}},
            },
            *tokenizer_statements(tokenizers),
        ],
    }


@dataclass(frozen=True)
class GatewayIdentityArgs:
    settings: Settings
    cloud: Cloud
    cluster_name: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    tags: Mapping[str, str]
    #: IRSA on a created cluster: the OIDC provider the runtime's role trusts, and its issuer.
    oidc_provider_arn: pulumi.Input[str] | None = None
    oidc_issuer: pulumi.Input[str] | None = None


class GatewayIdentity(pulumi.ComponentResource):
    """The gateway's service account's IAM role: made here on a created cluster, else the stack's
    ``kubernetes.gateway_role_arn``; with EKS Pod Identity, associated with that service account."""

    role_arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: GatewayIdentityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("frontier:kubernetes:GatewayIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        k = _k8s(args.settings)
        tags = dict(args.tags)
        if k.cluster.mode == "existing":
            self.role_arn = pulumi.Output.from_input(k.gateway_role_arn)
        else:
            role = aws.iam.Role(
                f"{name}-gateway",
                description=f"Frontier {args.settings.stack}: gateway pods ({k.namespace}/{GATEWAY_SERVICE_ACCOUNT})",
                assume_role_policy=service_account_trust(
                    k.identity, k.namespace, GATEWAY_SERVICE_ACCOUNT, args.oidc_provider_arn, args.oidc_issuer
                ),
                tags=tags,
                opts=child,
            )
            aws.iam.RolePolicy(
                f"{name}-gateway",
                role=role.id,
                policy=pulumi.Output.from_input(args.kms_key_arn).apply(
                    lambda key: json.dumps(gateway_pod_policy(args.settings, args.cloud, key))
                ),
                opts=child,
            )
            self.role_arn = role.arn
        if k.identity == "pod_identity":
            aws.eks.PodIdentityAssociation(
                f"{name}-gateway",
                cluster_name=args.cluster_name,
                namespace=k.namespace,
                service_account=GATEWAY_SERVICE_ACCOUNT,
                role_arn=self.role_arn,
                tags=tags,
                opts=child,
            )
        self.register_outputs({"role_arn": self.role_arn})


def preflight(settings: Settings, cloud: Cloud, placement: GpuPlacement | None) -> None:
    zones = cloud.availability_zones[: settings.network.availability_zones]
    placing = node_pool_problems(settings, zones, placement) if placement is not None else ()
    refuse_problems(settings, [*_problems(settings, cloud), *placing])


def build_kubernetes(settings: Settings) -> KubernetesOutputs[pulumi.Input[str]]:
    k = _k8s(settings)
    cloud = look_up(settings.region)
    # A created cluster's node groups are the stack's to place; an existing cluster's are not.
    placement = (
        look_up_placement(settings, [t for pool in k.node_pools for t in pool.instance_types])
        if k.cluster.mode == "create"
        else None
    )
    preflight(settings, cloud, placement)
    stack, production = settings.stack, is_production(settings)
    tags = base_tags(stack)
    create = k.cluster.mode == "create"
    foundation = Foundation(
        stack,
        FoundationArgs(
            settings=settings, cloud=cloud, production=production, network=create, ssm_access=False
        ),
    )
    secrets, storage, registry = foundation.secrets, foundation.storage, foundation.registry
    # No target group: the ALB belongs to the load balancer controller, which puts this ACL in front.
    web_acl = (
        StackWebAcl(
            f"{stack}-edge",
            WebAclArgs(stack, settings.edge.waf_rate_limit, settings.edge.allow_cidrs, tags),
        )
        if has_web_acl(settings)
        else None
    )
    identity = foundation.identity()
    deploy = KubernetesDeployRole(f"{stack}-k8s", identity, cloud.arn("eks", f"cluster/{k.cluster.name}"))
    # The release key's policy names its one signer, which exists only now.
    foundation.release_key.signed_by(deploy.arn)

    if create:
        network = foundation.network
        assert network is not None and placement is not None
        cluster = EksCluster(
            f"{stack}-eks",
            EksArgs(
                stack=stack,
                cloud=cloud,
                kubernetes=k,
                node_groups=settings.node_groups,
                vpc_id=network.vpc_id,
                vpc_cidr=settings.network.vpc_cidr,
                zones=foundation.zones,
                pool_zones=node_pool_zones(settings, foundation.zones, placement),
                private_subnet_ids=network.private_subnet_ids,
                public_subnet_ids=network.public_subnet_ids,
                kms_key_arn=secrets.key_arn,
                deploy_role_arn=deploy.arn,
                tags=tags,
            ),
            opts=pulumi.ResourceOptions(protect=production),
        )
        cluster_name: pulumi.Input[str] = cluster.name
        oidc_issuer: pulumi.Input[str] = cluster.oidc_issuer
        kubeconfig: pulumi.Input[str] = cluster.kubeconfig
        context = None
        provider = cluster.provider
    else:
        cluster_name, oidc_issuer = k.cluster.name, ""
        kubeconfig, context = os.path.expanduser(k.cluster.kubeconfig), k.cluster.context
        provider = None
    # Each pool's pods run as a service account and role of their own: its weights, secret and
    # history only. With IRSA the first role made makes the cluster's OIDC provider; the rest trust it.
    runtimes: dict[str, WorkloadIdentity] = {}
    oidc_provider_arn: pulumi.Input[str] | None = None
    for pool in settings.pools:
        runtimes[pool.name] = runtime = WorkloadIdentity(
            f"{stack}-pods{principal_suffix(settings, pool)}",
            WorkloadIdentityArgs(
                identity=identity,
                pool=pool,
                mode=k.identity,
                namespace=k.namespace,
                service_account=pool_service_account(settings, pool),
                cluster_name=cluster_name,
                oidc_issuer=oidc_issuer,
                tags=tags,
                role_arn=k.runtime_role_arn if k.cluster.mode == "existing" else "",
                oidc_provider_arn=oidc_provider_arn,
            ),
        )
        oidc_provider_arn = oidc_provider_arn or runtime.oidc_provider_arn
    roles = {name: runtime.runtime_role_arn for name, runtime in runtimes.items()}

    # A cluster of the stack's own gets its add-ons here; an existing cluster brings its own.
    addons = None
    if create:
        assert network is not None
        # Spot nodes drain on their notice: the stack's queue, which the Node Termination Handler reads.
        notices = notice_queue(stack, tags, settings.node_groups)
        addons = ClusterAddons(
            f"{stack}-addons",
            ClusterAddonsArgs(
                settings=settings,
                cloud=cloud,
                provider=cluster.provider,
                cluster_name=cluster_name,
                vpc_id=network.vpc_id,
                after=cluster.system_ready,
                tags=tags,
                oidc_provider_arn=oidc_provider_arn,
                oidc_issuer=oidc_issuer,
                notice_queue_url=notices.queue_url if notices else None,
                notice_queue_arn=notices.queue_arn if notices else None,
            ),
        )

    gateway = None
    if settings.gateway is not None:
        gateway = GatewayIdentity(
            f"{stack}-gw",
            GatewayIdentityArgs(
                settings=settings,
                cloud=cloud,
                cluster_name=cluster_name,
                kms_key_arn=secrets.key_arn,
                tags=tags,
                oidc_provider_arn=oidc_provider_arn,
                oidc_issuer=oidc_issuer,
            ),
        )

    # The pods' logs go to the groups EC2's hosts write, with the same retention and key.
    pod_logs = PodLogs(
        f"{stack}-logs",
        PodLogsArgs(
            settings=settings,
            cloud=cloud,
            cluster_name=cluster_name,
            kms_key_arn=secrets.key_arn,
            retention_days=retention_days(production),
            tags=tags,
            oidc_provider_arn=oidc_provider_arn,
            oidc_issuer=oidc_issuer,
        ),
    )

    workloads = Workloads(
        f"{stack}-runtime",
        WorkloadsArgs(
            settings=settings,
            kubeconfig=kubeconfig,
            context=context,
            role_arns=roles,
            gateway_role_arn=gateway.role_arn if gateway is not None else None,
            log_shipper_role_arn=pod_logs.role_arn,
            access_logs_bucket=storage.logs_bucket,
            web_acl_arn=web_acl.arn if web_acl is not None else None,
            provider=provider,
            addons=addons,
        ),
    )
    return KubernetesOutputs(
        region=cloud.region,
        weights_bucket=storage.weights_bucket,
        weights_prefix=storage.weights_prefix,
        history_bucket=storage.history_bucket,
        history_prefix=storage.history_prefix,
        ecr_repository_url=registry.repository_url,
        api_keys_secret_arn=arns[0] if len(arns := list(secrets.api_keys_secret_arns.values())) == 1 else "",
        api_keys_secret_arns=secrets.api_keys_secret_arns,
        kms_key_arn=secrets.key_arn,
        release_key_arn=foundation.release_key.arn,
        deploy_role_arn=deploy.arn,
        runtime_role_arn=only[0] if len(only := list(roles.values())) == 1 else "",
        runtime_role_arns=roles,
        cluster_name=cluster_name,
        namespace=workloads.namespace,
        deployment=workloads.deployment_name,
        endpoint=f"https://{k.ingress.host}",
    )
