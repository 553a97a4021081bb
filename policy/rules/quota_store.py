"""The gateway's quota store (infra/quota_store.py): an ElastiCache group closed to anyone without
TLS and its AUTH token.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from policy.rules.reading import get, truthy
from policy.rules.validation import resource_policy

CACHE_GROUP = ("aws:elasticache/replicationGroup:ReplicationGroup",)


def check_cache_closed(props: Mapping[str, Any], _: ResourceValidationArgs) -> Iterator[str]:
    if not truthy(get(props, "transitEncryptionEnabled")):
        yield "ElastiCache group without encryption in transit: set transit_encryption_enabled=True"
    if not truthy(get(props, "atRestEncryptionEnabled")):
        yield "ElastiCache group without encryption at rest: set at_rest_encryption_enabled=True"
    if not get(props, "authToken"):
        yield "ElastiCache group takes clients without an AUTH token: set auth_token"


# Checked on every stack: the store holds no data worth less protection outside production.
POLICIES = [
    resource_policy(
        "cache-encrypted-with-auth",
        "ElastiCache groups encrypt in transit and at rest and require an AUTH token.",
        CACHE_GROUP,
        check_cache_closed,
    ),
]
