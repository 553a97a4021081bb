"""What the gateway's principal reads of the weights: the tokenizer files of each pool it routes by
KV events (``runtime.kv_events``), fetched at its start (``kv_routing.tokenizer_source``), and not
one other object — never a weights shard, never a listing.

The EC2 gateway role (``infra/gateway.py``), the Kubernetes gateway's role
(``infra/kubernetes_program.py``) and the local stack's gateway user
(``frontier/targets/local/iam.py``) add this statement as it is written here.
"""

from __future__ import annotations

from typing import Any

from frontier_gateway.kv_index import TOKENIZER_FILES

from frontier.access.gateway import tokenizer_source
from frontier.config.schema import Settings

SID = "ReadItsTokenizers"


def tokenizer_arns(settings: Settings, partition: str = "aws") -> list[str]:
    """The tokenizer objects of every pool whose runtimes publish KV events, as S3 object ARNs."""
    arns: list[str] = []
    for pool in settings.pools:
        if pool.runtime.kv_events.enabled:
            source = tokenizer_source(pool).removeprefix("s3://")
            arns.extend(f"arn:{partition}:s3:::{source}/{name}" for name in TOKENIZER_FILES)
    return arns


def tokenizer_statements(arns: list[str]) -> list[dict[str, Any]]:
    """The statement granting exactly ``arns`` to be read; none where no pool routes by KV events."""
    if not arns:
        return []
    return [{"Sid": SID, "Effect": "Allow", "Action": "s3:GetObject", "Resource": arns}]
