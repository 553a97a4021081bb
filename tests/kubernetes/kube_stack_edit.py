"""Change one value of a stack file by its settings path (``kubernetes.node_pools[0].name``)."""

from __future__ import annotations


def set_field(config: dict, field: str, value: object) -> None:
    """``kubernetes.node_pools[0].name`` → set that value under ``frontier:kubernetes``."""
    steps: list[str | int] = []
    for part in field.split("."):
        name, _, rest = part.partition("[")
        steps.append(name)
        if rest:
            steps.append(int(rest.rstrip("]")))
    first, *rest_steps = steps
    key = "aws:region" if first == "region" else f"frontier:{first}"
    if not rest_steps:
        config[key] = value
        return
    parent = config[key]
    for step in rest_steps[:-1]:
        parent = parent[step]
    parent[rest_steps[-1]] = value
