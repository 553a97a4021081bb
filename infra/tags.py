"""Tags every resource carries. ``fab`` discovers hosts by the node-group tags (see :mod:`infra.nodes`)."""

from __future__ import annotations

from frontier_hostside.names import (  # noqa: F401  (re-exported for the components)
    MANAGED_BY_TAG,
    NODE_GROUP_TAG,
    PURPOSE_TAG,
    ROLE_TAG,
    RUNTIME_ROLE,
    STACK_TAG,
    TAG_PREFIX,
)


def base_tags(stack: str) -> dict[str, str]:
    return {STACK_TAG: stack, MANAGED_BY_TAG: "pulumi"}


def with_tags(tags: dict[str, str], **extra: str) -> dict[str, str]:
    """``with_tags(t, purpose="weights")`` adds ``frontier:purpose = weights``."""
    return tags | {f"{TAG_PREFIX}{key.replace('_', '-')}": value for key, value in extra.items()}
