"""The gateway's typed configuration, read from the rendered ``gateway.yaml``.

The toolkit renders it per stack from the stack's models, tenants and gateway settings; the gateway
refuses anything else at start with the file, field and value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from frontier_hostside.names import (
    KV_EVENTS_PORT,
    KV_EVENTS_REPLAY_PORT,
    PRIORITY_CLASSES,
    PROBE_TENANT,
    READINESS_PATH,
    SESSION_HEADER,
)
from frontier_settings import ConfigError, load_model, parse_model
from frontier_settings.tracing import TracingSettings
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

__all__ = ["ConfigError", "GatewayConfig", "GatewaySettings", "HoldConfig", "load_config", "parse_config"]

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Ec2Discovery(_Strict):
    """Runtime hosts found by their tags: running instances of one stack's node group."""

    stack: str = Field(min_length=1)
    node_group: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    region: str = Field(min_length=1)
    interval_s: float = Field(default=15.0, gt=0, le=3600)


class KubernetesDiscovery(_Strict):
    """Runtime pods found by their Service's EndpointSlices: each ready endpoint is a replica, at
    the runtime's container port. The gateway asks the API server with its service account's token
    every ``interval_s``; its Role may list EndpointSlices in the namespace and nothing more."""

    namespace: str = Field(min_length=1, max_length=63)
    service: str = Field(min_length=1, max_length=63)
    port: int = Field(ge=1, le=65535)
    interval_s: float = Field(default=5.0, gt=0, le=3600)
    # The API server; empty: the one the pod runs under (KUBERNETES_SERVICE_HOST and _PORT).
    api_url: str = ""
    # The service account's token (read at every ask: a projected token is renewed on disk) and the
    # cluster's CA; an http:// api_url uses neither file's CA.
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


#: Where a pool's replicas are found, when they are not listed: on EC2 by their tags, or on
#: Kubernetes by their Service's EndpointSlices (each kind's fields tell them apart).
Discovery = Ec2Discovery | KubernetesDiscovery


class KvRoutingConfig(_Strict):
    """Route a pool's requests by the KV-cache events of its replicas (``kv_index.py``).

    The replicas publish them with ``runtime.kv_events.enabled`` (or vLLM's ``--kv-events-config``);
    the gateway tokenizes each request with the model's tokenizer and chat template to find the
    replica holding the longest cached prefix, blended with its requests in flight.
    """

    # Where the model's tokenizer.json and tokenizer_config.json come from: a directory on the
    # gateway's host, or the pool's weights version in S3 (s3://bucket/prefix/<version>, what the
    # runtimes load), whose two files the gateway fetches at start. One of the two.
    tokenizer_dir: str = Field(
        default="", description="A directory with the model's tokenizer.json and tokenizer_config.json."
    )
    tokenizer_source: str = Field(
        default="",
        pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?)?$",
        description="The model's weights version in S3, whose tokenizer files the gateway fetches at start.",
    )
    block_size: int = Field(default=16, ge=1, le=256, description="The replicas' runtime.block_size.")
    events_port: int = Field(default=KV_EVENTS_PORT, ge=1, le=65535)
    replay_port: int = Field(default=KV_EVENTS_REPLAY_PORT, ge=1, le=65535)
    # Several runtimes on one host: each replica's own (events, replay) ports, by base URL.
    ports: dict[str, tuple[int, int]] = Field(default_factory=dict)
    load_weight_blocks: float = Field(
        default=8.0, ge=0, le=100_000, description="Blocks of prefill one request in flight weighs."
    )
    share_cap: float = Field(
        default=1.25,
        ge=1,
        le=1000,
        description="A replica that took share_cap / replicas of the pool's last 32 decisions is "
        "passed over while another is under it, whatever it has cached.",
    )
    speculative_ttl_s: float = Field(default=2.0, ge=0, le=600)
    stale_after_s: float = Field(
        default=15.0, gt=0, le=3600, description="No events this long while owed: load-only routing."
    )

    @model_validator(mode="after")
    def _one_tokenizer(self) -> KvRoutingConfig:
        if bool(self.tokenizer_dir) == bool(self.tokenizer_source):
            raise ValueError(
                "kv_routing: give the tokenizer either as tokenizer_dir (a local directory) or as "
                f"tokenizer_source (s3://…), one of the two (got tokenizer_dir={self.tokenizer_dir!r}, "
                f"tokenizer_source={self.tokenizer_source!r})"
            )
        return self


class DisaggregationRouting(_Strict):
    """A pool's prefill and decode replicas (runtimes with ``kv_transfer.role`` prefill and decode):
    its requests go in two hops (``disaggregation.py``); its ``replicas`` are the colocated
    fallback taken while no prefill or no decode replica is ready. Each role's replicas are fixed
    base URLs or found on EC2 (``prefill_discovery``, ``decode_discovery``: each half's node group)."""

    prefill: tuple[str, ...] = Field(default=(), description="Base URLs of the prefill replicas.")
    decode: tuple[str, ...] = Field(default=(), description="Base URLs of the decode replicas.")
    prefill_discovery: Ec2Discovery | None = None
    decode_discovery: Ec2Discovery | None = None

    @field_validator("prefill", "decode")
    @classmethod
    def _urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return PoolConfig._urls(value)

    @model_validator(mode="after")
    def _roles_apart(self) -> DisaggregationRouting:
        for role, urls, where in (
            ("prefill", self.prefill, self.prefill_discovery),
            ("decode", self.decode, self.decode_discovery),
        ):
            if bool(urls) == (where is not None):
                raise ValueError(
                    f"disaggregation.{role}: give its replicas either as base URLs or found on EC2 "
                    f"({role}_discovery), one of the two"
                )
        both = sorted(set(self.prefill) & set(self.decode))
        if both:
            raise ValueError(f"disaggregation: {both} listed as both prefill and decode replicas")
        found = [d for d in (self.prefill_discovery, self.decode_discovery) if d is not None]
        if len(found) == 2 and found[0].node_group == found[1].node_group:
            raise ValueError(
                f"disaggregation: prefill and decode are found on one node group ({found[0].node_group}); "
                "a host runs one role, and its group says which"
            )
        return self

    def discoveries(self) -> dict[str, Ec2Discovery]:
        """Role -> where its replicas are found, for the roles found on EC2."""
        return {
            role: found
            for role, found in (("prefill", self.prefill_discovery), ("decode", self.decode_discovery))
            if found is not None
        }


class PoolConfig(_Strict):
    """One model and the runtimes that serve it: fixed base URLs, or found on EC2 or Kubernetes."""

    name: str = Field(min_length=1, max_length=512)
    replicas: tuple[str, ...] = Field(default=(), description="Base URLs, e.g. http://10.0.1.7:8000.")
    discovery: Discovery | None = None
    kv_routing: KvRoutingConfig | None = None
    disaggregation: DisaggregationRouting | None = None
    # The secret of the keys this pool's runtimes accept (their runtime.api_keys_secret): the gateway
    # presents its first key to them, and the probe's tenant is known by every key of it. Each pool
    # has its own; empty: the pool's runtimes take no key.
    api_keys_secret: str = ""
    # The pool that takes this model's batch work (another entry of models, whose runtimes answer to
    # this model's name too): a batch request for this model goes there and never to these replicas,
    # and its interactive requests never go there. Empty: batch work shares these replicas.
    offline: str = Field(default="", max_length=512)

    @model_validator(mode="after")
    def _one_source(self) -> PoolConfig:
        if bool(self.replicas or self.disaggregation) == (self.discovery is not None):
            raise ValueError(f"model {self.name!r}: give either replicas (base URLs) or discovery, not both")
        return self

    @field_validator("replicas")
    @classmethod
    def _urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            if not re.match(r"^https?://[A-Za-z0-9.:\[\]_-]+$", url):
                raise ValueError(f"replica {url!r} must be a base URL like http://10.0.1.7:8000 (no path)")
        if len(set(value)) != len(value):
            raise ValueError("replicas must be unique")
        return value


class TenantConfig(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,62}$")
    # Either the digests themselves (tests, files kept as secrets) or the Secrets Manager secret that
    # holds them as {"sha256": ["<hex>", ...]}; never a key in clear.
    key_sha256: tuple[str, ...] = ()
    api_key_secret: str = ""
    models: tuple[str, ...] = Field(min_length=1)
    requests_per_minute: int = Field(ge=1, le=10_000_000)
    tokens_per_minute: int = Field(ge=1, le=10_000_000_000)
    max_concurrent_requests: int = Field(ge=1, le=1_000_000)
    priority: Literal[PRIORITY_CLASSES]  # type: ignore[valid-type]

    @field_validator("name")
    @classmethod
    def _not_the_probes(cls, value: str) -> str:
        if value == PROBE_TENANT:
            raise ValueError(f"{value!r} is the synthetic probe's tenant, which the gateway makes itself")
        return value

    @field_validator("key_sha256")
    @classmethod
    def _digests(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for digest in value:
            if not SHA256_HEX.match(digest):
                raise ValueError("each key_sha256 entry must be 64 lowercase hex digits")
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> TenantConfig:
        if bool(self.key_sha256) == bool(self.api_key_secret):
            raise ValueError("give exactly one of key_sha256 and api_key_secret")
        return self


class AffinityConfig(_Strict):
    # prefix: the hash of the prompt's first prefix_chars characters picks the replica, so turns of a
    # conversation (same system prompt and history) land where their prefix is cached.
    mode: Literal["off", "header", "prefix"] = "prefix"
    header: str = Field(default=SESSION_HEADER, pattern=r"^[a-z0-9-]{1,64}$")
    prefix_chars: int = Field(default=256, ge=16, le=65_536)
    # Leave the affine replica when it holds this many more requests than the least loaded one.
    max_imbalance: int = Field(default=8, ge=1, le=10_000)


class ProbeConfig(_Strict):
    interval_s: float = Field(default=1.0, gt=0, le=60)
    timeout_s: float = Field(default=1.0, gt=0, le=60)


class MeteringConfig(_Strict):
    # A local file (JSON lines, appended) or s3://bucket/prefix (one object per flush).
    uri: str = Field(min_length=1)
    flush_s: float = Field(default=10.0, gt=0, le=3600)


class QuotaConfig(_Strict):
    """Where tenants' quota counters live. ``memory``: in each gateway process, so N gateways let a
    tenant through N times its limits; ``redis``: one Redis (ElastiCache on EC2) that every gateway
    of the stack shares, updated atomically by Lua scripts."""

    store: Literal["memory", "redis"] = "memory"
    # A Secrets Manager secret (name or ARN) holding {"password": "<AUTH token>"} and, where
    # redis_url is empty, {"url": "rediss://…"}: read at start. An EC2 stack with a gateway
    # provisions its store (infra/quota_store.py: ElastiCache) under this name when redis_url is empty.
    redis_auth_secret: str = Field(default="", pattern=r"^[A-Za-z0-9/_+=.@:-]{0,2048}$")
    # redis://host:6379/0 or rediss:// (TLS). No password inside: this file is written to disk.
    redis_url: str = Field(default="", validate_default=True)
    # Keys are <key_prefix>:{<tenant>}:…, so stacks may share one Redis.
    key_prefix: str = Field(default="frontier:quota", pattern=r"^[A-Za-z0-9:._-]{1,64}$")
    # Answers from Redis slower than this refuse the request (503) rather than hold it.
    timeout_s: float = Field(default=0.5, gt=0, le=10)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str, info: ValidationInfo) -> str:
        store = info.data.get("store")
        if store == "redis" and not value and not info.data.get("redis_auth_secret"):
            raise ValueError(
                "store 'redis' needs a redis_url (redis://host:6379/0), or a redis_auth_secret "
                "that holds the url (a store the stack provisions)"
            )
        if store == "memory" and value:
            raise ValueError("is set but store is 'memory' (set store: redis, or leave redis_url out)")
        if store == "memory" and info.data.get("redis_auth_secret"):
            raise ValueError(
                "redis_auth_secret is set but store is 'memory' (set store: redis, or leave it out)"
            )
        if value and not re.match(r"^rediss?://[A-Za-z0-9.\[\]:_-]+(/[0-9]{1,2})?$", value):
            raise ValueError(
                "must look like redis://host:6379/0 or rediss://host:6379 "
                "(no user or password: the file is written to disk)"
            )
        return value


class BreakerConfig(_Strict):
    """The circuit breaker per replica: out for ``cool_off_s`` when more than ``error_rate`` of its
    answers over the last ``window_s`` failed (once it had ``min_requests`` there), then one trial
    request decides whether it comes back. ``error_rate: 1.0`` never trips."""

    window_s: float = Field(default=30.0, gt=0, le=3600)
    error_rate: float = Field(default=0.5, gt=0, le=1)
    min_requests: int = Field(default=5, ge=1, le=100_000)
    cool_off_s: float = Field(default=15.0, gt=0, le=3600)


class HoldConfig(_Strict):
    """How a pool with no ready replica holds requests while one starts (a pool scaled to zero, or
    one whose replicas all went): at most ``max_requests`` wait, each at most ``timeout_s``; past
    either, a 503 with Retry-After."""

    max_requests: int = Field(ge=1, le=100_000)
    timeout_s: float = Field(gt=0, le=3600)


class GatewaySettings(_Strict):
    """The stack's ``gateway:`` section, exactly as the gateway reads it."""

    port: int = Field(default=8090, ge=0, le=65535)
    # /metrics (tenant names and volumes) and the detailed readiness answer are served only here,
    # never on the public port the balancer forwards to: a scraper on the host reaches loopback.
    admin_host: str = Field(default="127.0.0.1", pattern=r"^[0-9A-Fa-f.:]+$|^localhost$")
    admin_port: int = Field(default=8091, ge=0, le=65535)
    affinity: AffinityConfig = AffinityConfig()
    probe: ProbeConfig = ProbeConfig()
    metering: MeteringConfig
    retries: int = Field(default=2, ge=0, le=10, description="Other replicas tried before any byte is sent.")
    # A generation whose replica fails after bytes reached the client continues at another replica
    # from the tokens it had (gateway/frontier_gateway/migration.py): at most this many attempts per
    # request, then an error event. 0: off (the stream ends with an error event at once).
    migration_limit: int = Field(
        default=3,
        ge=0,
        le=16,
        description="Attempts to continue a generation at another replica when its own fails.",
    )
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=104_857_600)
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    # Under the 300 s idle timeout AWS load balancers default to, which bounds a non-streamed answer.
    request_timeout_s: float = Field(default=290.0, gt=0, le=3600)
    # Completion tokens counted against tokens/min up front when a request names no max_tokens.
    default_max_tokens: int = Field(default=256, ge=1, le=1_048_576)
    quota: QuotaConfig = QuotaConfig()
    breaker: BreakerConfig = BreakerConfig()
    # Tenants' key digests and the runtimes' key are read again this often (SIGHUP: at once), so a
    # revoked tenant key stops working within this long and a rotation needs no restart.
    keys_reload_s: float = Field(default=60.0, ge=5, le=3600)
    # Per model (pool) name: its hold queue. A pool without one answers 503 at once when no replica
    # is ready; a pool that may scale to zero (min_size 0) must have one.
    hold: dict[str, HoldConfig] = Field(default_factory=dict)
    # Spans of each request (auth and quota, routing, the upstream call) over OTLP to the stack's
    # collector, with W3C trace context passed on to the runtime.
    tracing: TracingSettings = TracingSettings()

    @field_validator("admin_port")
    @classmethod
    def _not_the_public_port(cls, value: int, info: ValidationInfo) -> int:
        if value and value == info.data.get("port"):
            raise ValueError(
                f"must differ from port ({value}): the admin paths must not be reachable where tenants are"
            )
        return value


class GatewayConfig(GatewaySettings):
    """``gateway.yaml``: the stack's gateway section, plus its pools (each with its runtimes' key
    secret), tenants and probe path (from the stack's models, tenants, runtime and health sections)."""

    host: str = "0.0.0.0"
    models: tuple[PoolConfig, ...] = Field(min_length=1)
    tenants: tuple[TenantConfig, ...] = Field(min_length=1)
    readiness_path: str = Field(default=READINESS_PATH, pattern=r"^/[A-Za-z0-9_./-]*$")

    @model_validator(mode="after")
    def _tenants_name_models(self) -> GatewayConfig:
        served = [pool.name for pool in self.models]
        if len(set(served)) != len(served):
            raise ValueError(f"models must have unique names, got {served}")
        for tenant in self.tenants:
            unknown = [m for m in tenant.models if m not in served]
            if unknown:
                raise ValueError(
                    f"tenant {tenant.name!r} names models {unknown} that no pool serves ({served})"
                )
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"tenants must have unique names, got {names}")
        unheld = [name for name in self.hold if name not in served]
        if unheld:
            raise ValueError(f"hold names models {unheld} that no pool serves ({served})")
        offline = {pool.name: pool.offline for pool in self.models if pool.offline}
        for name, taker in offline.items():
            if taker not in served or taker == name:
                raise ValueError(
                    f"model {name!r}: offline names {taker!r}, which must be another pool of models ({served})"
                )
            if taker in offline:
                raise ValueError(
                    f"model {name!r}: offline names {taker!r}, which sends its own batch work to "
                    f"{offline[taker]!r}: an offline pool takes batch work, it does not pass it on"
                )
        return self


def parse_config(text: str, source: str = "gateway.yaml") -> GatewayConfig:
    return parse_model(GatewayConfig, text, source)


def load_config(path: str | Path) -> GatewayConfig:
    return load_model(GatewayConfig, path)
