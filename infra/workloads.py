"""The runtime's Kubernetes objects as typed ``pulumi_kubernetes`` resources.

Built from :func:`frontier.targets.kubernetes.manifests.render_workload`, the same renderer ``fab render``
writes YAML from, so what Pulumi applies and what a GitOps tool would apply are one thing. No Helm
chart or YAML expansion inside the provider: every object is a resource of its own kind, visible to
the policy pack and to tests under mocks.

Who owns what: Pulumi creates the objects and keeps their shape; the Deployment's pod template and
replica count belong to ``fab deploy`` (releases roll through the canary and the gate) and to KEDA
(replicas), so Pulumi ignores changes there and does not wait for the Deployment to become ready.
ConfigMaps are named by content and kept when replaced, so a previous revision can still start.

On a cluster this stack creates, each object that needs a cluster add-on (GPUs to request, a CRD,
a controller's webhook) waits for that add-on's release (:data:`infra.addons.NEEDED_BY`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
from frontier_hostside.names import PLACEHOLDER_DIGEST

from frontier.config.schema import Settings
from frontier.targets.kubernetes.manifests import Manifest, Workload, render_workload
from infra.addons import ClusterAddons
from infra.storage import LB_LOG_PREFIX

KINDS: Mapping[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Service"): k8s.core.v1.Service,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("networking.k8s.io/v1", "Ingress"): k8s.networking.v1.Ingress,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
}
# Top-level fields of the objects above, by their Python argument names.
ARGUMENTS = {
    "spec": "spec",
    "data": "data",
    "immutable": "immutable",
    "automountServiceAccountToken": "automount_service_account_token",
}
SKIP_AWAIT = "pulumi.com/skipAwait"
LB_ATTRIBUTES = "alb.ingress.kubernetes.io/load-balancer-attributes"
# What `fab deploy` and KEDA change on a live Deployment.
RELEASE_FIELDS = ["spec.template", "spec.replicas"]


@dataclass(frozen=True)
class WorkloadsArgs:
    settings: Settings
    #: The cluster's kubeconfig (its contents, or a file path) and the context in it, if not current.
    kubeconfig: pulumi.Input[str]
    context: str | None = None
    role_arn: pulumi.Input[str] | None = None
    #: The stack's access-log bucket: an ALB made by the load balancer controller logs there too.
    access_logs_bucket: pulumi.Input[str] | None = None
    #: A created cluster's provider (else one is made from ``kubeconfig``) and its add-ons.
    provider: k8s.Provider | None = None
    addons: ClusterAddons | None = None


def release_digest(settings: Settings) -> str:
    """The image the first Deployment names: ``kubernetes.image`` where set, else the placeholder."""
    k = settings.kubernetes
    return k.image.partition("@")[2] if k is not None and k.image else PLACEHOLDER_DIGEST


def with_access_logs(ingress: Manifest, bucket: pulumi.Input[str]) -> Manifest:
    """The ALB's attributes plus access logs to the stack's bucket (a name known only to Pulumi)."""
    if LB_ATTRIBUTES not in ingress.annotations:  # an ingress class of the cluster's own: not an ALB
        return ingress
    attributes = pulumi.Output.concat(
        ingress.annotations[LB_ATTRIBUTES],
        ",access_logs.s3.enabled=true,access_logs.s3.bucket=",
        bucket,
        f",access_logs.s3.prefix={LB_LOG_PREFIX}",
    )
    return dataclasses.replace(ingress, annotations={**ingress.annotations, LB_ATTRIBUTES: attributes})


def resource_for(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    key = (manifest.api_version, manifest.kind)
    metadata = manifest.metadata
    if manifest.kind == "Deployment":
        metadata = {**metadata, "annotations": {**metadata.get("annotations", {}), SKIP_AWAIT: "true"}}
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(ignore_changes=RELEASE_FIELDS))
    if manifest.kind == "ConfigMap":
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(retain_on_delete=True))
    if key not in KINDS:  # a custom resource (KEDA, the Prometheus Operator)
        return k8s.apiextensions.CustomResource(
            name,
            api_version=manifest.api_version,
            kind=manifest.kind,
            metadata=metadata,
            spec=manifest.body["spec"],
            opts=opts,
        )
    kwargs = {ARGUMENTS[field]: value for field, value in manifest.body.items()}
    return KINDS[key](name, metadata=metadata, opts=opts, **kwargs)


class Workloads(pulumi.ComponentResource):
    deployment_name: str
    namespace: str

    def __init__(self, name: str, args: WorkloadsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:kubernetes:Workloads", name, None, opts)
        workload: Workload = render_workload(
            args.settings, release_digest(args.settings), role_arn=args.role_arn
        )
        provider = args.provider or k8s.Provider(
            f"{name}-cluster",
            kubeconfig=args.kubeconfig,
            context=args.context,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        namespace = resource_for(f"{name}-namespace", workload.namespace, child)
        self.resources = {"Namespace": [namespace]}
        for manifest in workload.all()[1:]:
            if manifest.kind == "Ingress" and args.access_logs_bucket is not None:
                manifest = with_access_logs(manifest, args.access_logs_bucket)
            needs = args.addons.needed_by(manifest.kind) if args.addons is not None else []
            inside = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace, *needs])
            resource = resource_for(f"{name}-{manifest.kind.lower()}-{manifest.name}", manifest, inside)
            self.resources.setdefault(manifest.kind, []).append(resource)
        self.deployment_name, self.namespace = workload.deployment.name, workload.namespace.name
        self.register_outputs({"deployment": workload.deployment.name, "namespace": workload.namespace.name})
