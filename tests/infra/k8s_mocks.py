"""The Kubernetes stacks' program under mocks: infra_mocks' AWS, plus what EKS computes.

Kubernetes objects need no API server under mocks: pulumi_kubernetes resources are recorded with
their inputs like any other (the engine and the provider are what the mocks stand in for).
"""

from __future__ import annotations

import contextvars
import runpy
from typing import Any

from infra_mocks import MAIN, Graph, _ensure_event_loop, _Recorder, _run

from frontier.config.schema import Settings
from infra.program import build
from tests.infra.cloud_mocks import CA_DATA, EKS_ENDPOINT, OIDC_ISSUER, EksCloudMocks


class EksMocks(_Recorder, EksCloudMocks):
    """EKS's account, recording what the program created."""


def run_kubernetes(settings: Settings, *, entry_point: bool = False, **mock_options: Any) -> Graph:
    """``build(settings)``, or with ``entry_point`` ``infra/__main__.py`` as ``pulumi up`` runs it."""
    mocks = EksMocks(settings.region, **mock_options)
    program = (lambda _: runpy.run_path(str(MAIN))) if entry_point else build
    _ensure_event_loop()
    return contextvars.Context().run(_run, settings, program, mocks)


__all__ = ["CA_DATA", "EKS_ENDPOINT", "OIDC_ISSUER", "EksMocks", "run_kubernetes"]
