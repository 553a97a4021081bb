"""The rules of Frontier's policy pack, one module per concern, importable on their own (the pack is
``policy/__main__.py``, which hands the engine :data:`POLICIES`).

Each module holds its rules as plain functions and its ``POLICIES``: :mod:`~policy.rules.validation`
says how a function becomes a pulumi-policy policy (one resource's inputs, or every resource's
outputs) and :mod:`~policy.rules.reading` how a rule reads the properties the engine hands it.

Enforcement is mandatory, except for the few rules marked advisory: some are about hygiene rather
than exposure, and the rest each report one case the stack's own programs still have, named next to
the rule (tests/infra/test_policy.py's KNOWN_BREAKS), until that case is fixed and the rule folded
into its mandatory sibling.
"""

from __future__ import annotations

from policy.rules import edge, hosts, iam, kubernetes, network, production, quota_store, storage

# The pack's rules, concern by concern; the tests run this same list against the mocked programs.
POLICIES = [
    *iam.POLICIES,
    *network.POLICIES,
    *edge.POLICIES,
    *hosts.POLICIES,
    *storage.POLICIES,
    *kubernetes.POLICIES,
    *production.POLICIES,
    *quota_store.POLICIES,
]
