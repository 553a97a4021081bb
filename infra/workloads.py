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

A pool whose replica spans several nodes is a LeaderWorkerSet instead
(:mod:`frontier.targets.kubernetes.leader_workers`): alike, its two pod templates belong to ``fab
deploy`` and its replicas to KEDA; its replica key is a Secret of its own, its value made here
(``pulumi_random``, kept in the state as a secret), created before the LeaderWorkerSet that names it.

A stack with a gateway gets every model pool's objects and the gateway's. The gateway's Deployment
is Pulumi's whole: its image and config come from the stack file, so ``pulumi up`` applies a
changed ``gateway.yaml`` as a new ConfigMap and the Deployment rolls to it (see
:mod:`frontier.targets.kubernetes.gateway`).

The Prometheus stack's part (:func:`frontier.targets.kubernetes.monitoring.monitoring_objects`: the
resource alerts, the routes by severity, the dashboard, the GPU exporter's Service and
ServiceMonitor) is applied here too, in ``kubernetes.monitoring.prometheus_namespace``: that
namespace is created on a cluster this stack creates, and is the monitoring stack's own on an
existing one. All but the GPU exporter's DaemonSet (:data:`NOT_APPLIED`): a node agent that mounts
the kubelet's pod-resources socket (hostPath), runs as root with SYS_ADMIN and names its image by
tag, which the policy pack's mandatory ``k8s-no-privileged-pods`` and ``k8s-images-by-digest``
refuse for every workload. ``fab render`` writes it (``kubernetes/monitoring/``) for the monitoring
stack to apply, until the policy pack admits that one agent by name.

The pods' log shipper (:mod:`frontier.targets.kubernetes.logging`) likewise: its namespace, service
account, config and NetworkPolicy are applied here, its DaemonSet (the node's log files, as root) is
written by ``fab render`` (``kubernetes/logging/``) for the cluster's operator to apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
from frontier_hostside.names import K8S_CONFIG_HASH_ANNOTATION, PLACEHOLDER_DIGEST

from frontier.config.checks import is_production
from frontier.config.schema import PoolSettings, Settings
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes.logging import logging_objects
from frontier.targets.kubernetes.manifests import Manifest, Workload, render_workload
from frontier.targets.kubernetes.monitoring import DCGM_NAME, monitoring_objects
from frontier.targets.kubernetes.objects import app_labels, kubernetes_of
from infra.addons import ClusterAddons
from infra.storage import LB_LOG_PREFIX

KINDS: Mapping[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Service"): k8s.core.v1.Service,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("networking.k8s.io/v1", "Ingress"): k8s.networking.v1.Ingress,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
}
# Top-level fields of the objects above, by their Python argument names.
ARGUMENTS = {
    "spec": "spec",
    "data": "data",
    "immutable": "immutable",
    "automountServiceAccountToken": "automount_service_account_token",
    "rules": "rules",
    "roleRef": "role_ref",
    "subjects": "subjects",
}
SKIP_AWAIT = "pulumi.com/skipAwait"
LB_ATTRIBUTES = "alb.ingress.kubernetes.io/load-balancer-attributes"
WAF_ACL_ANNOTATION = "alb.ingress.kubernetes.io/wafv2-acl-arn"
LB_DELETION_PROTECTION = "deletion_protection.enabled"
# What `fab deploy` and KEDA change on a live runtime Deployment.
RELEASE_FIELDS = ["spec.template", "spec.replicas"]
# What `fab deploy` and KEDA change on a live LeaderWorkerSet.
GROUP_FIELDS = [
    "spec.leaderWorkerTemplate.leaderTemplate",
    "spec.leaderWorkerTemplate.workerTemplate",
    "spec.replicas",
]
# The replica key: long enough for an HMAC key, letters and digits only (an env value as is).
REPLICA_KEY_LENGTH = 64
# Rendered but not applied by Pulumi (see the module docstring): (kind, name).
NOT_APPLIED = frozenset({("DaemonSet", DCGM_NAME)})
# Kinds whose CRD comes with another kind's add-on: the Prometheus Operator's CRDs chart brings
# AlertmanagerConfig with ServiceMonitor and PrometheusRule.
SAME_ADDON_AS = {"AlertmanagerConfig": "PrometheusRule"}


@dataclass(frozen=True)
class WorkloadsArgs:
    settings: Settings
    #: The cluster's kubeconfig (its contents, or a file path) and the context in it, if not current.
    kubeconfig: pulumi.Input[str]
    context: str | None = None
    #: Each pool's pods' IAM role by model name (IRSA annotates that pool's service account with it).
    role_arns: Mapping[str, pulumi.Input[str]] | None = None
    #: The gateway's IAM role (IRSA annotates its service account with it), where the stack has one.
    gateway_role_arn: pulumi.Input[str] | None = None
    #: The pods' log shipper's IAM role (IRSA annotates its service account with it).
    log_shipper_role_arn: pulumi.Input[str] | None = None
    #: The stack's access-log bucket: an ALB made by the load balancer controller logs there too.
    access_logs_bucket: pulumi.Input[str] | None = None
    #: The stack's web ACL, which the controller puts in front of the ALB it makes for the Ingress.
    web_acl_arn: pulumi.Input[str] | None = None
    #: A created cluster's provider (else one is made from ``kubeconfig``) and its add-ons.
    provider: k8s.Provider | None = None
    addons: ClusterAddons | None = None


def release_digest(settings: Settings) -> str:
    """The image the first Deployment names: ``kubernetes.image`` where set, else the placeholder."""
    k = settings.kubernetes
    return k.image.partition("@")[2] if k is not None and k.image else PLACEHOLDER_DIGEST


def with_access_logs(ingress: Manifest, bucket: pulumi.Input[str], production: bool) -> Manifest:
    """The ALB's attributes plus access logs to the stack's bucket (a name known only to Pulumi) and,
    on a production stack, deletion protection (as ``enable_deletion_protection`` on EC2's ALB)."""
    if LB_ATTRIBUTES not in ingress.annotations:  # an ingress class of the cluster's own: not an ALB
        return ingress
    attributes = pulumi.Output.concat(
        ingress.annotations[LB_ATTRIBUTES],
        ",access_logs.s3.enabled=true,access_logs.s3.bucket=",
        bucket,
        f",access_logs.s3.prefix={LB_LOG_PREFIX}",
        f",{LB_DELETION_PROTECTION}=true" if production else "",
    )
    return dataclasses.replace(ingress, annotations={**ingress.annotations, LB_ATTRIBUTES: attributes})


def with_web_acl(ingress: Manifest, acl_arn: pulumi.Input[str]) -> Manifest:
    """The stack's web ACL in front of the ALB the controller makes (an ARN known only to Pulumi)."""
    return dataclasses.replace(ingress, annotations={**ingress.annotations, WAF_ACL_ANNOTATION: acl_arn})


def resource_for(
    name: str, manifest: Manifest, opts: pulumi.ResourceOptions, *, released: bool = False
) -> pulumi.CustomResource:
    """``manifest`` as its typed resource. ``released``: a runtime Deployment, whose pod template and
    replicas belong to ``fab deploy`` and KEDA. A LeaderWorkerSet's alike (:data:`GROUP_FIELDS`)."""
    key = (manifest.api_version, manifest.kind)
    metadata = manifest.metadata
    if manifest.kind == "Deployment":
        metadata = {**metadata, "annotations": {**metadata.get("annotations", {}), SKIP_AWAIT: "true"}}
    if released:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(ignore_changes=RELEASE_FIELDS))
    if manifest.kind == lw.KIND:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(ignore_changes=GROUP_FIELDS))
    if manifest.kind == "ConfigMap" and K8S_CONFIG_HASH_ANNOTATION in manifest.annotations:
        # Named by content: a previous revision of its Deployment may still start with it.
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


def monitoring_namespace(settings: Settings) -> Manifest | None:
    """The Prometheus stack's namespace where this stack creates the cluster (nothing else makes it)."""
    k = settings.kubernetes
    if k is None or k.cluster.mode != "create":
        return None
    name = k.monitoring.prometheus_namespace
    return Manifest("v1", "Namespace", name, None, {}, labels={"kubernetes.io/metadata.name": name})


def applied_logging_objects(settings: Settings, role_arn: Any = None) -> list[Manifest]:
    """The pods' log shipper's objects that Pulumi applies: all but its DaemonSet (node files, root)."""
    return [m for m in logging_objects(settings, role_arn) if m.kind != "DaemonSet"]


def applied_monitoring_objects(settings: Settings) -> list[Manifest]:
    """The Prometheus stack's part that Pulumi applies: all but :data:`NOT_APPLIED`."""
    return [m for m in monitoring_objects(settings) if (m.kind, m.name) not in NOT_APPLIED]


class Workloads(pulumi.ComponentResource):
    deployment_name: str
    namespace: str

    def __init__(self, name: str, args: WorkloadsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("frontier:kubernetes:Workloads", name, None, opts)
        workload: Workload = render_workload(
            args.settings,
            release_digest(args.settings),
            role_arns=args.role_arns,
            gateway_role_arn=args.gateway_role_arn,
        )
        provider = args.provider or k8s.Provider(
            f"{name}-cluster",
            kubeconfig=args.kubeconfig,
            context=args.context,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self._args, self._provider = args, provider
        self.resources: dict[str, list[pulumi.CustomResource]] = {}
        namespace = self._add(f"{name}-namespace", workload.namespace, [])
        released = {d.name for d in workload.runtime_deployments}
        keys = {
            lw.set_name(pool): self._replica_key(name, pool, namespace)
            for pool in args.settings.pools
            if lw.replica_spans_nodes(pool)
        }
        for manifest in workload.all()[1:]:
            if manifest.kind == "Ingress" and args.access_logs_bucket is not None:
                manifest = with_access_logs(manifest, args.access_logs_bucket, is_production(args.settings))
            if manifest.kind == "Ingress" and args.web_acl_arn is not None:
                manifest = with_web_acl(manifest, args.web_acl_arn)
            is_runtime = manifest.kind == "Deployment" and manifest.name in released
            # A LeaderWorkerSet's pods start only once the Secret their key comes from exists.
            after = [namespace, *([keys[manifest.name]] if manifest.kind == lw.KIND else [])]
            self._add(f"{name}-{manifest.kind.lower()}-{manifest.name}", manifest, after, released=is_runtime)
        # The Prometheus stack's part, in its own namespace.
        monitoring_ns = monitoring_namespace(args.settings)
        after = []
        if monitoring_ns is not None:
            after.append(self._add(f"{name}-monitoring-namespace", monitoring_ns, []))
        for manifest in applied_monitoring_objects(args.settings):
            self._add(f"{name}-monitoring-{manifest.kind.lower()}-{manifest.name}", manifest, after)
        # The pods' log shipper's namespace, identity, config and policy (its DaemonSet: fab render).
        shipper_after: list[pulumi.Resource] = []
        for manifest in applied_logging_objects(args.settings, args.log_shipper_role_arn):
            added = self._add(
                f"{name}-logging-{manifest.kind.lower()}-{manifest.name}", manifest, shipper_after
            )
            if manifest.kind == "Namespace":
                shipper_after = [added]
        self.deployment_name, self.namespace = workload.deployment.name, workload.namespace.name
        self.deployments = [d.name for d in workload.runtime_deployments]
        self.register_outputs({"deployment": workload.deployment.name, "namespace": workload.namespace.name})

    def _replica_key(self, name: str, pool: PoolSettings, namespace: pulumi.Resource) -> k8s.core.v1.Secret:
        """The pool's replica key, made once and kept in the state (a secret output), as the Secret its
        pods read it from."""
        secret = lw.replica_key_secret(pool)
        key = random.RandomPassword(
            f"{name}-{secret}",
            length=REPLICA_KEY_LENGTH,
            special=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        resource = k8s.core.v1.Secret(
            f"{name}-secret-{secret}",
            metadata={
                "name": secret,
                "namespace": kubernetes_of(self._args.settings).namespace,
                "labels": app_labels(pool),
            },
            type="Opaque",
            string_data={lw.REPLICA_KEY_FIELD: key.result},
            opts=pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=[namespace]),
        )
        self.resources.setdefault("Secret", []).append(resource)
        return resource

    def _add(
        self, resource_name: str, manifest: Manifest, after: list[pulumi.Resource], *, released: bool = False
    ) -> pulumi.CustomResource:
        """``manifest`` after ``after`` and after the add-ons its kind needs."""
        addons = self._args.addons
        needs = (
            addons.needed_by(SAME_ADDON_AS.get(manifest.kind, manifest.kind)) if addons is not None else []
        )
        opts = pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=[*after, *needs])
        resource = resource_for(resource_name, manifest, opts, released=released)
        self.resources.setdefault(manifest.kind, []).append(resource)
        return resource
