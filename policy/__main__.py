"""Frontier's policy pack: ``pulumi preview|up -s <stack> --policy-pack policy``.

Rules live in :mod:`policy.rules` so the tests can run them on their own against a mocked program.
"""

import sys
from pathlib import Path

# The CLI runs this file from policy/; the rules are imported as the `policy` package.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policy.rules import POLICIES  # noqa: E402

PolicyPack(
    name="frontier",
    description="Guardrails for Frontier's GPU inference clusters on AWS.",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=POLICIES,
)
