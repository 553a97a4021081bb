"""IAM as data: the policy documents of a stack's principals, free of Pulumi.

The cloud programs (``infra/identity.py``, ``infra/workload_identity.py``) make roles from these
documents, and the local stack (``frontier/targets/local/iam.py``) makes moto users from the very
same ones, so what a principal may do is written once. Each pool's hosts or pods are a principal of
their own (:mod:`frontier.identity.pools`).
"""
