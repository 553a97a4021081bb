"""Tags every resource carries. ``fab`` discovers hosts by the node-group tags (see :mod:`infra.nodes`)."""

from __future__ import annotations

STACK_TAG = "frontier:stack"
PURPOSE_TAG = "frontier:purpose"
ROLE_TAG = "frontier:role"
NODE_GROUP_TAG = "frontier:node-group"
RUNTIME_ROLE = "runtime"


def base_tags(stack: str) -> dict[str, str]:
    return {STACK_TAG: stack, "frontier:managed-by": "pulumi"}


def with_tags(tags: dict[str, str], **extra: str) -> dict[str, str]:
    """``with_tags(t, purpose="weights")`` adds ``frontier:purpose = weights``."""
    return tags | {f"frontier:{key.replace('_', '-')}": value for key, value in extra.items()}
