"""The Pulumi program of a ``kubernetes`` stack: the same buckets, key, secret and registry as on EC2,
then either an EKS cluster with GPU node groups (``cluster: create``) or an existing cluster's
kubeconfig (``cluster: existing``), and the runtime's workloads on it.

:func:`infra.program.build` hands a ``kubernetes`` stack here; everything follows from the settings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pulumi

from frontier.config.schema import Kubernetes, Settings
from infra.addons import ClusterAddons, ClusterAddonsArgs
from infra.cloud import Cloud, look_up
from infra.eks import EksArgs, EksCluster
from infra.errors import ProvisionError
from infra.foundation import Foundation, FoundationArgs
from infra.outputs import KubernetesOutputs
from infra.tags import base_tags
from infra.workload_identity import KubernetesDeployRole, WorkloadIdentity, WorkloadIdentityArgs
from infra.workloads import Workloads, WorkloadsArgs

PRODUCTION_STACKS = frozenset({"prod", "eks-prod"})


def _k8s(settings: Settings) -> Kubernetes:
    assert settings.kubernetes is not None
    return settings.kubernetes


def _problems(s: Settings, cloud: Cloud) -> Iterator[str]:
    k = _k8s(s)
    if k.ingress.kind == "alb":
        cert_region = s.edge.certificate_arn.split(":")[3] if s.edge.certificate_arn.count(":") >= 5 else ""
        if cert_region != cloud.region:
            yield (
                f"edge.certificate_arn = {s.edge.certificate_arn!r}: an ALB needs an ACM certificate of its own "
                f"region ({cloud.region})"
            )
    registry = f"{cloud.account_id}.dkr.ecr.{cloud.region}.{cloud.dns_suffix}"
    host, _, path = s.runtime.image_repository.partition("/")
    if host != registry or not path:
        yield (
            f"runtime.image_repository = {s.runtime.image_repository!r}: nodes pull the runtime from the ECR "
            f"repository this stack creates; expected {registry}/<name>"
        )
    if k.cluster.mode == "create" and len(cloud.availability_zones) < 2:
        yield f"region {cloud.region}: EKS needs two availability zones for its control plane"
    if k.cluster.mode == "existing" and not os.path.exists(os.path.expanduser(k.cluster.kubeconfig)):
        yield f"kubernetes.cluster.kubeconfig = {k.cluster.kubeconfig!r}: no such file"


def preflight(settings: Settings, cloud: Cloud) -> None:
    problems = list(_problems(settings, cloud))
    if problems:
        lines = [f"{settings.source}: {len(problems)} problem(s) for provisioning stack {settings.stack!r}"]
        raise ProvisionError("\n".join([*lines, *(f"  {p}" for p in problems)]))


def build_kubernetes(settings: Settings) -> KubernetesOutputs[pulumi.Input[str]]:
    k = _k8s(settings)
    cloud = look_up(settings.region)
    preflight(settings, cloud)
    stack, production = settings.stack, settings.stack in PRODUCTION_STACKS
    tags = base_tags(stack)
    create = k.cluster.mode == "create"
    foundation = Foundation(
        stack,
        FoundationArgs(
            settings=settings, cloud=cloud, production=production, network=create, ssm_access=False
        ),
    )
    secrets, storage, registry = foundation.secrets, foundation.storage, foundation.registry
    # No target group: the ALB belongs to the load balancer controller.
    identity = foundation.identity()
    deploy = KubernetesDeployRole(f"{stack}-k8s", identity, cloud.arn("eks", f"cluster/{k.cluster.name}"))

    if create:
        network = foundation.network
        assert network is not None
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
    runtime = WorkloadIdentity(
        f"{stack}-pods",
        WorkloadIdentityArgs(
            identity=identity,
            mode=k.identity,
            namespace=k.namespace,
            service_account=k.service_account,
            cluster_name=cluster_name,
            oidc_issuer=oidc_issuer,
            tags=tags,
            role_arn=k.runtime_role_arn if k.cluster.mode == "existing" else "",
        ),
    )

    # A cluster of the stack's own gets its add-ons here; an existing cluster brings its own.
    addons = None
    if create:
        assert network is not None
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
                oidc_provider_arn=runtime.oidc_provider_arn,
                oidc_issuer=oidc_issuer,
            ),
        )

    workloads = Workloads(
        f"{stack}-runtime",
        WorkloadsArgs(
            settings=settings,
            kubeconfig=kubeconfig,
            context=context,
            role_arn=runtime.runtime_role_arn,
            access_logs_bucket=storage.logs_bucket,
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
        api_keys_secret_arn=secrets.api_keys_secret_arn,
        kms_key_arn=secrets.key_arn,
        deploy_role_arn=deploy.arn,
        runtime_role_arn=runtime.runtime_role_arn,
        cluster_name=cluster_name,
        namespace=workloads.namespace,
        deployment=workloads.deployment_name,
        endpoint=f"https://{k.ingress.host}",
    )
