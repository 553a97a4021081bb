"""Compose one environment from a stack's settings: the whole Pulumi program, as a function.

``infra/__main__.py`` calls :func:`build` with ``load_stack(pulumi.get_stack())``; the tests call it
under mocks with each stack's settings. The target picks the program: :mod:`infra.ec2_program` for an
``ec2`` stack, :mod:`infra.kubernetes_program` for a ``kubernetes`` one; the embedded local stack is
refused, since Pulumi never provisions it.
"""

from __future__ import annotations

import pulumi

from frontier.config.schema import Settings
from infra.ec2_program import build_ec2
from infra.errors import ProvisionError
from infra.kubernetes_program import build_kubernetes
from infra.outputs import Ec2Outputs, KubernetesOutputs


def build(settings: Settings) -> Ec2Outputs[pulumi.Input[str]] | KubernetesOutputs[pulumi.Input[str]]:
    """Create every resource of the stack; returns what ``fab`` needs to operate it."""
    refuse_local(settings)
    if settings.target == "kubernetes":
        return build_kubernetes(settings)
    return build_ec2(settings)


def refuse_local(settings: Settings) -> None:
    if settings.target == "local":
        raise ProvisionError(
            f"stack {settings.stack!r} is the embedded local environment ({settings.source} has a 'local:' "
            "section): it runs on this machine through `fab`, with moto and HAProxy standing in for AWS, and is "
            "never provisioned by Pulumi. Pick a cloud stack: pulumi up -s dev|staging|prod"
        )
