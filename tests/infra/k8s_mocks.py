"""The Kubernetes stacks' program under mocks: infra_mocks' AWS, plus what EKS computes.

Kubernetes objects need no API server under mocks: pulumi_kubernetes resources are recorded with
their inputs like any other (the engine and the provider are what the mocks stand in for).
"""

from __future__ import annotations

import contextvars
import runpy
from typing import Any

from infra_mocks import ACCOUNT_ID, MAIN, Graph, _Recorder, _run
from pulumi.runtime.mocks import MockResourceArgs

from frontier.config.schema import Settings
from infra.program import build

OIDC_ISSUER = "https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"
ENDPOINT = "https://EXAMPLE0123.gr7.us-east-1.eks.amazonaws.com"
CA_DATA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


class EksMocks(_Recorder):
    def _computed(self, args: MockResourceArgs) -> tuple[str, dict[str, Any]]:
        name = args.inputs.get("name") or args.name
        if args.typ == "aws:eks/cluster:Cluster":
            return name, {
                "arn": f"arn:aws:eks:{self.region}:{ACCOUNT_ID}:cluster/{name}",
                "name": name,
                "endpoint": ENDPOINT,
                "certificateAuthority": {"data": CA_DATA},
                "identities": [{"oidcs": [{"issuer": OIDC_ISSUER}]}],
            }
        if args.typ == "aws:iam/openIdConnectProvider:OpenIdConnectProvider":
            host = OIDC_ISSUER.removeprefix("https://")
            return host, {"arn": f"arn:aws:iam::{ACCOUNT_ID}:oidc-provider/{host}"}
        if args.typ == "aws:ec2/subnet:Subnet":
            return f"subnet-{abs(hash(args.name)) % 10**8:08d}", {}
        return super()._computed(args)


def run_kubernetes(settings: Settings, *, entry_point: bool = False) -> Graph:
    """``build(settings)``, or with ``entry_point`` ``infra/__main__.py`` as ``pulumi up`` runs it."""
    mocks = EksMocks(settings.region)
    program = (lambda _: runpy.run_path(str(MAIN))) if entry_point else build
    return contextvars.Context().run(_run, settings, program, mocks)
