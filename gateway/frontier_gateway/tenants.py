"""Who is calling: a bearer key, hashed, looked up among the tenants' stored SHA-256 digests.

Only digests are ever held (in Secrets Manager as ``{"sha256": ["<hex>", ...]}`` and in memory).
The lookup is by digest: the time it takes depends on the digest of the presented key, which an
attacker cannot steer towards a stored one, so it reveals nothing about stored keys.

Besides the stack's tenants, one the gateway makes itself: :data:`PROBE_TENANT`, whose keys are
the runtimes' (every key of every pool's secret, so a rotation never locks it out). The synthetic
probe (``frontier_hostside/probe.py``) presents a model's pool's first key on every target, and
holders of that key (the pool's runtime hosts, its service account) could already reach its
runtimes directly; through the public endpoint they get the probe's quota only, a few requests a
minute per model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontier_hostside.names import INTERACTIVE, PROBE_TENANT
from frontier_settings.auth import bearer_token

from frontier_gateway.config import SHA256_HEX, GatewayConfig, TenantConfig

#: The key the gateway presents to each pool's runtimes, by model name; a pool whose runtimes take
#: no key has none.
UpstreamKeys = Mapping[str, str]


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


# The probe sends one request per model a minute, from one place (EC2, local) or one CronJob per
# model (Kubernetes); the headroom covers a late run overlapping the next and a person trying it.
PROBE_REQUESTS_PER_MODEL_MINUTE = 6
PROBE_TOKENS_PER_REQUEST = 256  # a fixed prompt of a dozen tokens and one token out


def probe_tenant(models: Sequence[str]) -> Tenant:
    """The synthetic probe's tenant: every model, a few one-token requests a minute each."""
    return Tenant(
        name=PROBE_TENANT,
        models=frozenset(models),
        requests_per_minute=PROBE_REQUESTS_PER_MODEL_MINUTE * len(models),
        tokens_per_minute=PROBE_REQUESTS_PER_MODEL_MINUTE * PROBE_TOKENS_PER_REQUEST * len(models),
        max_concurrent_requests=2 * len(models),
        # Measured on the path interactive clients take, not behind batch work.
        priority=INTERACTIVE,
    )


def load_tenants(
    configs: Iterable[TenantConfig],
    *,
    client: Any | None = None,
    probe_keys: Sequence[str] = (),
    models: Sequence[str] = (),
) -> Tenants:
    """Each tenant with its digests: inline, or read once from its Secrets Manager secret; and,
    where ``probe_keys`` are given (the runtimes' keys), the probe's tenant on ``models``."""
    entries = []
    for config in configs:
        digests = config.key_sha256
        if config.api_key_secret:
            if client is None:
                import boto3

                client = boto3.client("secretsmanager")
            digests = read_digests(client, config.api_key_secret)
        entries.append((Tenant.from_config(config), digests))
    if probe_keys:
        entries.append((probe_tenant(models), tuple(key_digest(key) for key in probe_keys)))
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


def runtime_keys(client: Any | None, secret_id: str) -> tuple[str, ...]:
    """Every key of the runtimes' secret, in its order: the first is the one the gateway presents
    to the runtimes (``fab keys.rotate`` puts a new key first only once every runtime takes it)."""
    if client is None:
        import boto3

        client = boto3.client("secretsmanager")
    try:
        text: str = client.get_secret_value(SecretId=secret_id)["SecretString"].strip()
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        raise TenantKeyError(f"cannot read the runtimes' API key from secret {secret_id!r}: {code}") from None
    keys = [str(key) for key in json.loads(text).get("keys") or []] if text.startswith("{") else [text]
    keys = [key for key in keys if key]
    if not keys:
        raise TenantKeyError(f"secret {secret_id!r} holds no API key")
    return tuple(keys)


def upstream_key(client: Any | None, secret_id: str) -> str:
    """The key the gateway presents to a pool's runtimes: the first of their secret's keys."""
    return runtime_keys(client, secret_id)[0]


def read_keys(config: GatewayConfig, client: Any | None) -> tuple[Tenants, dict[str, str]]:
    """Who may call (the tenants, and the probe on every pool's runtime keys) and the key presented
    to each pool's runtimes, by model (none for a pool whose runtimes take none): what a gateway
    starts with and every reload reads. Each pool's secret is read once."""
    by_secret: dict[str, tuple[str, ...]] = {}
    for pool in config.models:
        if pool.api_keys_secret and pool.api_keys_secret not in by_secret:
            if client is None:
                import boto3

                client = boto3.client("secretsmanager")
            by_secret[pool.api_keys_secret] = runtime_keys(client, pool.api_keys_secret)
    upstream = {
        pool.name: by_secret[pool.api_keys_secret][0] for pool in config.models if pool.api_keys_secret
    }
    probe_keys = tuple(dict.fromkeys(key for keys in by_secret.values() for key in keys))
    tenants = load_tenants(
        config.tenants, client=client, probe_keys=probe_keys, models=[pool.name for pool in config.models]
    )
    return tenants, upstream


def replica_id_key(upstream: UpstreamKeys) -> bytes | None:
    """What a replica's public id is derived from: the runtimes' keys, which every gateway of the
    stack holds, so the id is the same on all of them (None: a process's own key, where there is none)."""
    if not upstream:
        return None
    return hashlib.blake2b(
        "\n".join(sorted(set(upstream.values()))).encode(), person=b"frontier-repid"
    ).digest()
