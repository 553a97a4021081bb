"""Reading the properties the engine hands a rule.

Properties arrive under their wire names (camelCase); numbers may arrive as floats and booleans of
some resources as the strings ``"true"``/``"false"``, so every reading here tolerates both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def get(props: Any, *path: str | int, default: Any = None) -> Any:
    """``get(props, "metadataOptions", "httpTokens")``; ``default`` where any step is missing."""
    value = props
    for step in path:
        if isinstance(step, int):
            if not is_list(value) or step >= len(value):
                return default
        elif not isinstance(value, Mapping) or step not in value:
            return default
        value = value[step]
    return default if value is None else value


def is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def as_list(value: Any) -> list[Any]:
    """A block that providers model either as one object or as a list of them."""
    if value is None:
        return []
    return list(value) if is_list(value) else [value]


def truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def as_int(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def tags_of(props: Mapping[str, Any]) -> Mapping[str, Any]:
    return get(props, "tags", default={}) or get(props, "tagsAll", default={})


def policy_document(value: Any) -> Mapping[str, Any]:
    """An IAM/S3 policy given as JSON text or as a structured document."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value.strip():
        return json.loads(value)
    return {}


def statements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in as_list(get(document, "Statement")) if isinstance(s, Mapping)]


def stack_of(urn: str) -> str:
    """``urn:pulumi:<stack>::<project>::...``: the stack a resource belongs to."""
    return urn.split("::", 1)[0].removeprefix("urn:pulumi:")
