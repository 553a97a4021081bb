"""One backend per target; :func:`backend_for` is the one place that looks at a stack's target."""

from __future__ import annotations

from frontier.backends.base import Backend
from frontier.config.schema import Settings
from frontier.errors import FrontierError


def backend_for(settings: Settings) -> Backend:
    match settings.target:
        case "local":
            from frontier.backends.local import LocalBackend

            return LocalBackend(settings)
        case "ec2":
            from frontier.backends.ec2 import Ec2Backend

            return Ec2Backend(settings)
        case "kubernetes":
            from frontier.backends.kubernetes import KubernetesBackend

            return KubernetesBackend(settings)
    raise FrontierError(f"stack {settings.stack!r}: target {settings.target!r} has no backend")


__all__ = ["Backend", "backend_for"]
