"""Kubernetes (infra/eks.py, infra/workloads.py, infra/addons.py): pods pinned by digest, unprivileged,
hardened and limited; each workload with its own disruption budget and network policy; only the API
behind the Ingress; a private cluster endpoint.

Pods are read as the typed pulumi_kubernetes resources carry them, under their wire names.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from frontier_hostside.names import DIGEST_PATTERN, GPU_RESOURCE
from pulumi_policy import PolicyResource, ResourceValidationArgs

from policy.rules.edge import PUBLIC_PATH_PREFIX, not_api
from policy.rules.reading import as_int, as_list, get, truthy
from policy.rules.validation import of_type, resource_policy, stack_policy

# Kubernetes objects that run pods, and where each keeps its pod spec.
K8S_POD = ("kubernetes:core/v1:Pod",)
K8S_CRON_JOB = ("kubernetes:batch/v1:CronJob",)
K8S_TEMPLATED = (
    "kubernetes:apps/v1:Deployment",
    "kubernetes:apps/v1:StatefulSet",
    "kubernetes:apps/v1:DaemonSet",
    "kubernetes:apps/v1:ReplicaSet",
    "kubernetes:batch/v1:Job",
)
# A replica over several nodes: a leader's and a worker's pod template (sigs.k8s.io/lws).
K8S_LEADER_WORKER_SET = ("kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",)
K8S_POD_OWNERS = K8S_POD + K8S_CRON_JOB + K8S_TEMPLATED + K8S_LEADER_WORKER_SET
# Long-running workloads: each needs a disruption budget and a network policy of its own.
K8S_WORKLOADS = ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:StatefulSet", *K8S_LEADER_WORKER_SET)
K8S_PDB = ("kubernetes:policy/v1:PodDisruptionBudget",)
K8S_NETWORK_POLICY = ("kubernetes:networking.k8s.io/v1:NetworkPolicy",)
K8S_SERVICE = ("kubernetes:core/v1:Service",)
K8S_INGRESS = ("kubernetes:networking.k8s.io/v1:Ingress",)
EKS_CLUSTER = ("aws:eks/cluster:Cluster",)
EXPOSING_SERVICE_TYPES = ("LoadBalancer", "NodePort")
SECCOMP_CONFINED = ("RuntimeDefault", "Localhost")


def pod_specs(resource_type: str, props: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every pod spec the object carries (a LeaderWorkerSet: its leader's and its workers')."""
    if resource_type in K8S_POD:
        return [get(props, "spec", default={})]
    if resource_type in K8S_CRON_JOB:
        return [get(props, "spec", "jobTemplate", "spec", "template", "spec", default={})]
    if resource_type in K8S_LEADER_WORKER_SET:
        group = get(props, "spec", "leaderWorkerTemplate", default={})
        return [
            get(group, t, "spec", default={}) for t in ("leaderTemplate", "workerTemplate") if get(group, t)
        ]
    return [get(props, "spec", "template", "spec", default={})]


def pod_template_labels(resource_type: str, props: Mapping[str, Any]) -> Mapping[str, Any]:
    """The labels a workload's pods carry (a LeaderWorkerSet's: its worker template's, which its
    leader's include)."""
    if resource_type in K8S_LEADER_WORKER_SET:
        group = get(props, "spec", "leaderWorkerTemplate", default={})
        return get(group, "workerTemplate", "metadata", "labels", default={})
    return get(props, "spec", "template", "metadata", "labels", default={})


def pod_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        c for key in ("initContainers", "containers", "ephemeralContainers") for c in as_list(get(spec, key))
    ]


def check_k8s_digest_images(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for container in (c for spec in pod_specs(args.resource_type, props) for c in pod_containers(spec)):
        image = str(get(container, "image", default=""))
        _, _, digest = image.partition("@")
        if not DIGEST_PATTERN.match(digest):
            yield (
                f"container {get(container, 'name')!r} runs {image!r}: images must be pinned by digest "
                "(<repository>@sha256:<64 hex>), never a tag"
            )


def check_k8s_not_privileged(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for spec in pod_specs(args.resource_type, props):
        yield from _privileges(spec)


def _privileges(spec: Mapping[str, Any]) -> Iterator[str]:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if truthy(get(spec, key)):
            yield f"pod shares the node's namespaces ({key}: true)"
    for volume in as_list(get(spec, "volumes")):
        if get(volume, "hostPath") is not None:
            yield f"volume {get(volume, 'name')!r} mounts a path of the node (hostPath)"
    pod_non_root = truthy(get(spec, "securityContext", "runAsNonRoot"))
    for container in pod_containers(spec):
        name, security = get(container, "name"), get(container, "securityContext", default={})
        if truthy(get(security, "privileged")):
            yield f"container {name!r} is privileged"
        if get(security, "allowPrivilegeEscalation") not in (False, "false"):
            yield f"container {name!r} does not set allowPrivilegeEscalation: false"
        if as_list(get(security, "capabilities", "add")):
            yield f"container {name!r} adds capabilities {as_list(get(security, 'capabilities', 'add'))}"
        if not (pod_non_root or truthy(get(security, "runAsNonRoot"))):
            yield f"container {name!r} may run as root (no runAsNonRoot: true on it or its pod)"
        user = get(security, "runAsUser", default=get(spec, "securityContext", "runAsUser"))
        if as_int(user) == 0:
            yield f"container {name!r} runs as root (runAsUser: 0)"


def check_k8s_gpu_requests_equal_limits(
    props: Mapping[str, Any], args: ResourceValidationArgs
) -> Iterator[str]:
    for container in (c for spec in pod_specs(args.resource_type, props) for c in pod_containers(spec)):
        request = get(container, "resources", "requests", GPU_RESOURCE)
        limit = get(container, "resources", "limits", GPU_RESOURCE)
        if (request is not None or limit is not None) and as_int(request) != as_int(limit):
            yield (
                f"container {get(container, 'name')!r} requests {request} {GPU_RESOURCE} but is limited to "
                f"{limit}: GPUs are not shared, requests must equal limits"
            )


def _all_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*as_list(get(spec, "initContainers")), *as_list(get(spec, "containers"))]


def check_k8s_containers_hardened(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for spec in pod_specs(args.resource_type, props):
        yield from _hardening(spec)


def _hardening(spec: Mapping[str, Any]) -> Iterator[str]:
    pod_seccomp = get(spec, "securityContext", "seccompProfile", "type")
    for container in _all_containers(spec):
        name, security = get(container, "name"), get(container, "securityContext", default={})
        if not truthy(get(security, "readOnlyRootFilesystem")):
            yield f"container {name!r} has a writable root file system (readOnlyRootFilesystem: true)"
        if get(security, "seccompProfile", "type", default=pod_seccomp) not in SECCOMP_CONFINED:
            yield f"container {name!r} runs without a seccomp profile (seccompProfile.type: RuntimeDefault)"


def check_k8s_containers_limited(props: Mapping[str, Any], args: ResourceValidationArgs) -> Iterator[str]:
    for container in (c for spec in pod_specs(args.resource_type, props) for c in _all_containers(spec)):
        limits = get(container, "resources", "limits", default={})
        missing = [r for r in ("cpu", "memory") if get(limits, r) is None]
        if missing:
            yield f"container {get(container, 'name')!r} has no {' or '.join(missing)} limit"


def _selects(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A label selector's matchLabels against a pod's labels (an empty selector selects every pod)."""
    wanted = get(selector, "matchLabels", default={})
    return all(labels.get(key) == value for key, value in wanted.items())


def check_k8s_pdb_and_network_policy(
    resources: Sequence[PolicyResource],
) -> Iterator[tuple[PolicyResource, str]]:
    """Every workload has a disruption budget and a network policy that select its pods by their labels."""
    for workload in of_type(resources, K8S_WORKLOADS):
        namespace = get(workload.props, "metadata", "namespace")
        labels = pod_template_labels(workload.resource_type, workload.props)
        near = [r for r in resources if get(r.props, "metadata", "namespace") == namespace]
        if not any(_selects(get(p.props, "spec", "selector"), labels) for p in of_type(near, K8S_PDB)):
            yield workload, "no PodDisruptionBudget selects its pods: a node drain may take them all at once"
        own = [
            p
            for p in of_type(near, K8S_NETWORK_POLICY)
            if get(p.props, "spec", "podSelector", "matchLabels")
            and _selects(get(p.props, "spec", "podSelector"), labels)
        ]
        if not own:
            yield workload, "no NetworkPolicy selects its pods: what may reach them is not declared"


def check_ingress_api_only(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    backend = get(props, "spec", "defaultBackend")
    if backend:
        yield f"Ingress has a default backend: it forwards every path, only {PUBLIC_PATH_PREFIX}* may be public"
    for rule in as_list(get(props, "spec", "rules")):
        for entry in as_list(get(rule, "http", "paths")):
            path = get(entry, "path")
            if not_api(path):
                yield f"Ingress forwards {path or '(every path)'!r}: only {PUBLIC_PATH_PREFIX}* may be public"


def check_service_not_exposed(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    kind = get(props, "spec", "type", default="ClusterIP")
    if kind in EXPOSING_SERVICE_TYPES:
        yield f"Service of type {kind} opens the nodes or a load balancer of its own; use ClusterIP behind the Ingress"


def check_eks_private_endpoint(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    # EKS makes the endpoint public unless told otherwise, so a missing flag is a public endpoint.
    if get(props, "vpcConfig", "endpointPublicAccess") in (None, True, "true"):
        yield "EKS API endpoint is public: set vpc_config.endpoint_public_access=False"


POLICIES = [
    resource_policy(
        "k8s-images-by-digest",
        "Kubernetes workloads run images pinned by digest.",
        K8S_POD_OWNERS,
        check_k8s_digest_images,
    ),
    resource_policy(
        "k8s-no-privileged-pods",
        "Kubernetes pods run unprivileged, as non-root, without the node's namespaces or paths.",
        K8S_POD_OWNERS,
        check_k8s_not_privileged,
    ),
    resource_policy(
        "k8s-gpu-requests-equal-limits",
        "GPU requests equal GPU limits.",
        K8S_POD_OWNERS,
        check_k8s_gpu_requests_equal_limits,
    ),
    resource_policy(
        "k8s-containers-hardened",
        "Containers have a read-only root file system and a RuntimeDefault seccomp profile.",
        K8S_POD_OWNERS,
        check_k8s_containers_hardened,
    ),
    resource_policy(
        "k8s-containers-limited",
        "Containers have CPU and memory limits.",
        K8S_POD_OWNERS,
        check_k8s_containers_limited,
    ),
    stack_policy(
        "k8s-pdb-and-network-policy-per-workload",
        "Every Kubernetes workload has a PodDisruptionBudget and a NetworkPolicy of its own.",
        check_k8s_pdb_and_network_policy,
    ),
    resource_policy(
        "k8s-ingress-forwards-only-api",
        "Ingresses forward only /v1/ paths.",
        K8S_INGRESS,
        check_ingress_api_only,
    ),
    resource_policy(
        "k8s-services-not-exposed",
        "Kubernetes Services are neither LoadBalancer nor NodePort: the Ingress is the only way in.",
        K8S_SERVICE,
        check_service_not_exposed,
    ),
    resource_policy(
        "eks-private-endpoint", "The EKS API endpoint is private.", EKS_CLUSTER, check_eks_private_endpoint
    ),
]
