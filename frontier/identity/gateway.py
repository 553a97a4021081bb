"""What the gateway's principal reads of the weights: the tokenizer files of each pool it routes by
KV events (``runtime.kv_events``), fetched at its start (``kv_routing.tokenizer_source``), and not
one other object — never a weights shard, never a listing.

The EC2 gateway role (``infra/gateway.py``), the Kubernetes gateway's role
(``infra/kubernetes_program.py``) and the local stack's gateway user
(``frontier/targets/local/iam.py``) add this statement as it is written here. The two cloud roles
also read and decrypt the gateway's secrets with the statements of :func:`secret_statements`.
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


def secret_statements(
    secret_arns: list[str], kms_key_arn: str, via: str | list[str] | None = None
) -> list[dict[str, Any]]:
    """The gateway's secrets (its tenants' key digests, the runtimes' keys, a quota store's token)
    read and decrypted with the stack's key; the key only through ``via`` where given (the services
    that read on the gateway's behalf)."""
    read = {
        "Sid": "ReadKeyDigests",
        "Effect": "Allow",
        "Action": "secretsmanager:GetSecretValue",
        "Resource": secret_arns,
    }
    decrypt: dict[str, Any] = {
        "Sid": "DecryptSecrets",
        "Effect": "Allow",
        "Action": "kms:Decrypt",
        "Resource": kms_key_arn,
    }
    if via is not None:
        decrypt["Condition"] = {"StringEquals": {"kms:ViaService": via}}
    return [read, decrypt]
