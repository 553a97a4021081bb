"""Namespaced RBAC: a Role of exact rules and the RoleBinding that gives it to one subject.

Every Role the stack makes lists verbs read off what its holder calls (``fab``'s tasks in
:mod:`.deploy_access`, the gateway's discovery in :mod:`.gateway`); the RBAC-enforcing fake API
server of the tests authorizes with the same :class:`Rule` objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from frontier.targets.kubernetes.objects import Manifest

RBAC = "rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class Rule:
    api_group: str  # "" is the core group
    resource: str  # with its subresource, as RBAC names it: "pods/portforward"
    verbs: tuple[str, ...]

    def allows(self, verb: str, api_group: str, resource: str) -> bool:
        return (self.api_group, self.resource) == (api_group, resource) and verb in self.verbs

    def to_dict(self) -> dict[str, list[str]]:
        return {"apiGroups": [self.api_group], "resources": [self.resource], "verbs": list(self.verbs)}


def role_for(
    name: str,
    namespace: str,
    rules: tuple[Rule, ...],
    subject: Mapping[str, str],
    labels: Mapping[str, str],
) -> tuple[Manifest, Manifest]:
    """The Role ``name`` of ``rules`` in ``namespace``, and its binding to ``subject`` (a Group, or a
    ServiceAccount with its namespace)."""
    role = Manifest(RBAC, "Role", name, namespace, {"rules": [r.to_dict() for r in rules]}, labels=dict(labels))
    binding = Manifest(
        RBAC,
        "RoleBinding",
        name,
        namespace,
        {
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [dict(subject)],
        },
        labels=dict(labels),
    )
    return role, binding
