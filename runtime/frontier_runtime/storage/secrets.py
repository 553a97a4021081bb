"""API keys from AWS Secrets Manager, read at start and on every reload, held only in memory.

The secret holds either JSON ``{"keys": ["k1", "k2"]}`` (several keys, so one can be rotated
while the other still works) or a plain string (one key). Endpoints and credentials come from
the standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, …), so moto's server stands
in for Secrets Manager without a special code path. No key value ever reaches a log line, an
exception message or the disk.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("frontier_runtime.secrets")


class SecretsError(RuntimeError):
    """The API keys cannot be loaded; the message names the secret, never its value."""


def load_api_keys(secret_id: str, *, client: Any | None = None) -> tuple[str, ...]:
    """Return the API keys stored in ``secret_id`` (at least one, each non-empty, no duplicates)."""
    if client is None:
        import boto3

        client = boto3.client("secretsmanager")
    try:
        response = client.get_secret_value(SecretId=secret_id)
    except Exception as exc:
        error = getattr(exc, "response", {}).get("Error", {})
        code = error.get("Code", type(exc).__name__)
        # AWS's message names the refused action and the caller, never the secret's value.
        message = str(error.get("Message", "")).strip()
        detail = f"{code}: {message}" if message else code
        raise SecretsError(f"cannot read API keys from secret {secret_id!r}: {detail}") from None
    keys = parse_keys(_secret_text(response, secret_id), secret_id)
    log.info(
        "api keys loaded", extra={"event": "api_keys_loaded", "secret_id": secret_id, "count": len(keys)}
    )
    return keys


def parse_keys(text: str, secret_id: str = "secret") -> tuple[str, ...]:
    """Keys from a secret's text: JSON ``{"keys": [...]}`` or a plain string holding one key."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            raise SecretsError(f"secret {secret_id!r} looks like JSON but does not parse") from None
        raw = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(raw, list) or not all(isinstance(k, str) for k in raw):
            raise SecretsError(f'secret {secret_id!r} must hold {{"keys": ["...", ...]}} (a list of strings)')
        keys = tuple(dict.fromkeys(k.strip() for k in raw if k.strip()))
    else:
        keys = (stripped,) if stripped else ()
    if not keys:
        raise SecretsError(f"secret {secret_id!r} holds no API key")
    return keys


def _secret_text(response: dict[str, Any], secret_id: str) -> str:
    if response.get("SecretString") is not None:
        text: str = response["SecretString"]
        return text
    binary = response.get("SecretBinary")
    if binary is None:
        raise SecretsError(f"secret {secret_id!r} has no value")
    try:
        return bytes(binary).decode("utf-8")
    except UnicodeDecodeError:
        raise SecretsError(f"secret {secret_id!r} is binary and not UTF-8 text") from None
