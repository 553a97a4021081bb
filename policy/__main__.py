"""Frontier's policy pack: ``pulumi preview|up -s <stack> --policy-pack policy``.

Rules live in :mod:`policy.rules`, one module per concern (IAM, network, the edge, the hosts, storage,
Kubernetes, production, the quota store), so the tests can run them on their own against a mocked
program; that package's ``POLICIES`` is the list the pack enforces.
"""

# The CLI runs this file from policy/ with the project's .venv (PulumiPolicy.yaml), where
# `make install` put the toolkit: the rules are imported as the installed `policy` package.
from pulumi_policy import EnforcementLevel, PolicyPack

from policy.rules import POLICIES

PolicyPack(
    name="frontier",
    description="Guardrails for Frontier's GPU inference clusters on AWS.",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=POLICIES,
)
