"""Exporting the stack outputs: the fields of :mod:`frontier.config.outputs`' models, one output each.

The models are the toolkit's (``fab`` reads them back without Pulumi); this is the one place that
turns them into Pulumi stack outputs (``pulumi stack output --json``).
"""

from __future__ import annotations

from typing import Any

import pulumi

from frontier.config.outputs import Ec2Outputs, KubernetesOutputs, StackOutputs

__all__ = ["Ec2Outputs", "KubernetesOutputs", "StackOutputs", "as_dict", "export"]


def as_dict(outputs: StackOutputs[Any]) -> dict[str, Any]:
    """Every field, its value as the program made it (an output may still be a promise)."""
    return {name: getattr(outputs, name) for name in type(outputs).model_fields}


def export(outputs: StackOutputs[Any]) -> None:
    for name, value in as_dict(outputs).items():
        pulumi.export(name, value)
