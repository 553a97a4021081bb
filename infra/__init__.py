"""Frontier's Pulumi program: one ComponentResource per concern, composed by :func:`infra.program.build`.

``pulumi up -s <stack>`` runs ``infra/__main__.py``, which reads ``stacks/Pulumi.<stack>.yaml``
through :func:`frontier.targets.load_stack` (nothing here parses a stack file) and builds one
environment: network, GPU node groups, buckets, registry, load balancer, secrets, monitoring, IAM.
"""
