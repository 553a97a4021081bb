"""Who is calling: a bearer key, hashed, looked up among the tenants' stored SHA-256 digests.

Only digests are ever held (in Secrets Manager as ``{"sha256": ["<hex>", ...]}`` and in memory).
The lookup is by digest: the time it takes depends on the digest of the presented key, which an
attacker cannot steer towards a stored one, so it reveals nothing about stored keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from frontier_settings.auth import bearer_token

from frontier_gateway.config import SHA256_HEX, TenantConfig


class TenantKeyError(RuntimeError):
    """Tenant keys cannot be loaded; names the secret, never its contents."""


def key_digest(key: str) -> str:
    """The hex SHA-256 of an API key, as stored in a tenant's secret."""
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Tenant:
    name: str
    models: frozenset[str]
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent_requests: int
    priority: str

    @classmethod
    def from_config(cls, config: TenantConfig) -> Tenant:
        return cls(
            name=config.name,
            models=frozenset(config.models),
            requests_per_minute=config.requests_per_minute,
            tokens_per_minute=config.tokens_per_minute,
            max_concurrent_requests=config.max_concurrent_requests,
            priority=config.priority,
        )


class Tenants:
    def __init__(self, entries: Iterable[tuple[Tenant, Iterable[str]]]) -> None:
        self._by_digest: dict[str, Tenant] = {}
        self.all: list[Tenant] = []
        for tenant, digests in entries:
            self.all.append(tenant)
            for digest in digests:
                if digest in self._by_digest:
                    raise TenantKeyError(
                        f"one key digest is given to tenants {self._by_digest[digest].name!r} and {tenant.name!r}"
                    )
                self._by_digest[digest] = tenant

    @property
    def key_count(self) -> int:
        return len(self._by_digest)

    def __repr__(self) -> str:  # never show digests
        return f"Tenants({[t.name for t in self.all]})"

    def identify(self, authorization: str | None) -> Tenant | None:
        token = bearer_token(authorization)
        if token is None:
            return None
        return self._by_digest.get(key_digest(token))


def load_tenants(configs: Iterable[TenantConfig], *, client: Any | None = None) -> Tenants:
    """Each tenant with its digests: inline, or read once from its Secrets Manager secret."""
    entries = []
    for config in configs:
        digests = config.key_sha256
        if config.api_key_secret:
            if client is None:
                import boto3

                client = boto3.client("secretsmanager")
            digests = read_digests(client, config.api_key_secret)
        entries.append((Tenant.from_config(config), digests))
    return Tenants(entries)


def read_digests(client: Any, secret_id: str) -> tuple[str, ...]:
    try:
        text = client.get_secret_value(SecretId=secret_id)["SecretString"]
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        raise TenantKeyError(f"cannot read tenant key digests from secret {secret_id!r}: {code}") from None
    try:
        digests = json.loads(text)["sha256"]
    except (ValueError, KeyError, TypeError):
        raise TenantKeyError(f'secret {secret_id!r} must hold {{"sha256": ["<64 hex>", ...]}}') from None
    if (
        not isinstance(digests, list)
        or not digests
        or not all(isinstance(d, str) and SHA256_HEX.match(d) for d in digests)
    ):
        raise TenantKeyError(
            f'secret {secret_id!r} must hold {{"sha256": ["<64 hex>", ...]}} with at least one digest'
        )
    return tuple(digests)


def upstream_key(client: Any | None, secret_id: str) -> str:
    """The key the gateway presents to the runtimes: the first of their secret's keys."""
    if client is None:
        import boto3

        client = boto3.client("secretsmanager")
    try:
        text: str = client.get_secret_value(SecretId=secret_id)["SecretString"].strip()
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        raise TenantKeyError(f"cannot read the runtimes' API key from secret {secret_id!r}: {code}") from None
    if text.startswith("{"):
        keys = json.loads(text).get("keys") or []
        text = keys[0] if keys else ""
    if not text:
        raise TenantKeyError(f"secret {secret_id!r} holds no API key")
    return text
