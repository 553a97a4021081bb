"""What ``fab`` may do in the stack's namespace: a Role of exactly the verbs its tasks use, bound to
the group the deploy role's EKS access entry names.

EKS's namespaced access policies (``AmazonEKSEditPolicy``) reach the built-in API groups only, so a
LeaderWorkerSet's patch is refused (403) under them; and they grant far more than a rollout needs
(Secrets, Services, every workload kind). The rules below are read off what the tasks call —
``deploy``/``rollback`` (the Deployment's or LeaderWorkerSet's rollout, its canary Deployment and the
ConfigMap of each release), ``status`` (pods), the canary gates (pod metrics through the API
server's proxy, verification over port-forward), ``scale`` (a workload's replicas) and a rollout
by traffic share (its ScaledObject paused, its Service's EndpointSlices read) — and
``tests/kubernetes/test_deploy_access.py`` drives those tasks against the API and holds every
request to them, and every rule to some request.
"""

from __future__ import annotations

from frontier.config.schema import Settings
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes.objects import Manifest, kubernetes_of, stack_labels
from frontier.targets.kubernetes.rbac import Rule, role_for

__all__ = ["DEPLOY_GROUP", "Rule", "deploy_role", "deploy_rules"]

# The Kubernetes group the deploy role's access entry maps it into (EKS: ``kubernetesGroups``).
DEPLOY_GROUP = "frontier:deploy"


def deploy_rules(settings: Settings) -> tuple[Rule, ...]:
    """The verbs ``fab`` uses on this stack, per resource; LeaderWorkerSets only where a pool has one."""
    rules = [
        # The rollout reads the Deployment, patches its template and replicas, and makes and
        # removes its canary.
        Rule("apps", "deployments", ("get", "create", "patch", "delete")),
        # Each release's runtime config; old ones are listed and pruned.
        Rule("", "configmaps", ("list", "create", "delete")),
        # fab status and the rollout's readiness: the pods of a workload, by label.
        Rule("", "pods", ("list",)),
        # The canary gates read a pod's /metrics through the API server.
        Rule("", "pods/proxy", ("get",)),
        # Canary verification talks to one pod: the WebSocket upgrade is a GET, which API servers
        # from 1.31 authorize as create as well (AuthorizePodWebsocketUpgradeCreatePermission).
        Rule("", "pods/portforward", ("get", "create")),
    ]
    if settings.rollout.verify_canary:
        # A verified canary pod is admitted to its Service by setting its readiness gate's condition.
        rules.append(Rule("", "pods/status", ("patch",)))
    if settings.rollout.traffic_steps:
        # A rollout by traffic share holds the replica counts itself: it pauses the pool's
        # ScaledObject, and counts the Service's ready endpoints after every step.
        rules.append(Rule("keda.sh", "scaledobjects", ("patch",)))
        rules.append(Rule("discovery.k8s.io", "endpointslices", ("list",)))
    if any(lw.replica_spans_nodes(pool) for pool in settings.pools):
        rules.append(Rule(lw.API_VERSION.partition("/")[0], lw.PLURAL, ("get", "patch")))
    return tuple(rules)


def deploy_role(settings: Settings) -> tuple[Manifest, Manifest]:
    """The Role and the RoleBinding that give :data:`DEPLOY_GROUP` :func:`deploy_rules`, in the
    stack's namespace only."""
    group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": DEPLOY_GROUP}
    return role_for(
        "frontier-deploy", kubernetes_of(settings).namespace, deploy_rules(settings), group, stack_labels()
    )
