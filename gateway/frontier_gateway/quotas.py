"""Per-tenant quotas: requests/min and tokens/min as token buckets, and concurrent requests.

A bucket holds up to a minute's allowance and refills continuously, so a tenant may burst up to
its per-minute limit and then proceeds at the limit's rate. Tokens are taken up front (an estimate:
prompt characters / 4 + the requested completion length, as OpenAI counts max_tokens) and settled
with the runtime's usage when the answer ends, so a tenant pays for what it used; a request that
used more than estimated leaves the bucket in debt, paid back by refill.

Headers follow OpenAI's: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, reset as a
duration until the bucket is full again ("1s", "6m0s", "120ms").

Where the counters live is the stack's ``quota.store``. ``memory``: in this process, so each
gateway process enforces the limits on its own (N gateways admit N times a tenant's limits).
``redis``: one Redis that every gateway of the stack shares; admission and settlement are one Lua
script each, so they are atomic across gateways, and time is the Redis server's (the gateways'
clocks play no part). In-flight requests are a sorted set of request ids that expire after the
gateway's request timeout, so a gateway that dies holding requests frees its tenants' slots.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from frontier_hostside import names

from frontier_gateway.config import QuotaConfig
from frontier_gateway.tenants import Tenant

log = logging.getLogger("frontier_gateway.quotas")


class QuotaStoreError(RuntimeError):
    """The quota store could not answer; the request is refused rather than let through unmetered."""


@dataclass(frozen=True)
class Levels:
    """A tenant's buckets right after a decision: what its rate-limit headers say."""

    tenant: Tenant
    requests: float
    tokens: float

    def headers(self) -> dict[str, str]:
        t = self.tenant
        return {
            names.LIMIT_REQUESTS: str(t.requests_per_minute),
            names.REMAINING_REQUESTS: str(max(0, math.floor(self.requests))),
            names.RESET_REQUESTS: format_duration(_seconds_to_full(self.requests, t.requests_per_minute)),
            names.LIMIT_TOKENS: str(t.tokens_per_minute),
            names.REMAINING_TOKENS: str(max(0, math.floor(self.tokens))),
            names.RESET_TOKENS: format_duration(_seconds_to_full(self.tokens, t.tokens_per_minute)),
        }


def _seconds_to_full(level: float, per_minute: int) -> float:
    return max(0.0, (per_minute - level) * 60.0 / per_minute)


def _seconds_until(level: float, amount: float, per_minute: int) -> float:
    """Seconds until ``amount`` can be taken (infinite when it exceeds a full bucket)."""
    if amount > per_minute:
        return math.inf
    return max(0.0, (amount - level) * 60.0 / per_minute)


@dataclass(frozen=True)
class Refusal:
    limit: str  # requests | tokens | concurrency
    message: str
    retry_after_s: float
    levels: Levels


def refusal(limit: str, levels: Levels, in_flight: int, estimated_tokens: int) -> Refusal:
    """The 429 for the first limit a request hit, worded like OpenAI's."""
    t = levels.tenant
    if limit == "concurrency":
        return Refusal(
            limit,
            f"Rate limit reached for tenant {t.name!r} on concurrent requests: limit "
            f"{t.max_concurrent_requests}, in flight {in_flight}. Retry when one finishes.",
            1.0,
            levels,
        )
    if limit == "requests":
        wait = _seconds_until(levels.requests, 1, t.requests_per_minute)
        return Refusal(
            limit,
            f"Rate limit reached for tenant {t.name!r} on requests per min (RPM): limit "
            f"{t.requests_per_minute}, used {t.requests_per_minute - math.floor(levels.requests)}. "
            f"Please try again in {format_duration(wait)}.",
            wait,
            levels,
        )
    wait = _seconds_until(levels.tokens, estimated_tokens, t.tokens_per_minute)
    too_big = math.isinf(wait)
    return Refusal(
        limit,
        f"Rate limit reached for tenant {t.name!r} on tokens per min (TPM): limit "
        f"{t.tokens_per_minute}, remaining {max(0, math.floor(levels.tokens))}, requested "
        f"{estimated_tokens}. "
        + (
            "The request is larger than the per-minute limit; lower max_tokens."
            if too_big
            else f"Please try again in {format_duration(wait)}."
        ),
        60.0 if too_big else wait,
        levels,
    )


@dataclass
class Grant:
    """What one admitted request holds; ``settle`` once with the tokens it really used (None: the
    estimate stands). Settling gives back the concurrency slot and corrects the tokens taken."""

    tenant: Tenant
    request_id: str
    tokens_taken: int
    levels: Levels
    _release: Callable[[Grant, int | None], asyncio.Task[None] | None]
    settled: bool = field(default=False)
    _settling: asyncio.Task[None] | None = None

    def settle(self, used_tokens: int | None) -> None:
        if self.settled:
            return
        self.settled = True
        self._settling = self._release(self, used_tokens)

    async def wait_settled(self) -> None:
        """Until the store holds the settlement (at once for the memory store), so a client's next
        request finds its slot free again."""
        if self._settling is not None:
            await asyncio.shield(self._settling)


class Quotas(ABC):
    """Admission against a tenant's requests/min, tokens/min and concurrent requests."""

    @abstractmethod
    async def admit(self, tenant: Tenant, estimated_tokens: int, request_id: str) -> Grant | Refusal:
        """Take one request and ``estimated_tokens`` tokens, or refuse without taking anything;
        :class:`QuotaStoreError` when the store cannot answer."""

    @abstractmethod
    async def aclose(self) -> None:
        """Finish pending settlements and let go of the store."""


# -- memory: this process's buckets ----------------------------------------------------------------


@dataclass
class Bucket:
    per_minute: int
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.per_minute, self.level + (now - self.updated) * self.per_minute / 60.0)
        self.updated = now


@dataclass
class TenantQuota:
    requests: Bucket
    tokens: Bucket
    in_flight: int = 0


class MemoryQuotas(Quotas):
    def __init__(self, tenants: list[Tenant], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._quotas = {
            t.name: TenantQuota(
                Bucket(t.requests_per_minute, t.requests_per_minute, now),
                Bucket(t.tokens_per_minute, t.tokens_per_minute, now),
            )
            for t in tenants
        }

    async def admit(self, tenant: Tenant, estimated_tokens: int, request_id: str) -> Grant | Refusal:
        q = self._quotas[tenant.name]
        now = self._clock()
        q.requests.refill(now)
        q.tokens.refill(now)
        levels = Levels(tenant, q.requests.level, q.tokens.level)
        if q.in_flight >= tenant.max_concurrent_requests:
            return refusal("concurrency", levels, q.in_flight, estimated_tokens)
        if q.requests.level < 1:
            return refusal("requests", levels, q.in_flight, estimated_tokens)
        if q.tokens.level < estimated_tokens:
            return refusal("tokens", levels, q.in_flight, estimated_tokens)
        q.requests.level -= 1
        q.tokens.level -= estimated_tokens
        q.in_flight += 1
        levels = Levels(tenant, q.requests.level, q.tokens.level)
        return Grant(tenant, request_id, estimated_tokens, levels, self._release)

    async def aclose(self) -> None:
        pass  # nothing outlives the process

    def _release(self, grant: Grant, used_tokens: int | None) -> None:
        q = self._quotas[grant.tenant.name]
        q.in_flight -= 1
        if used_tokens is not None:
            q.tokens.refill(self._clock())
            q.tokens.level -= used_tokens - grant.tokens_taken
        return None


# -- redis: one store for every gateway of the stack -------------------------------------------------

# KEYS: the tenant's bucket hash, its in-flight sorted set.
# ARGV: requests/min, tokens/min, max concurrent, estimated tokens, request id, seconds to hold it.
# Returns {verdict, requests level, tokens level, in flight}; levels as strings (Lua numbers would
# be cut to integers on the way out).
ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local most, estimate, hold = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local b = redis.call('HMGET', KEYS[1], 'requests', 'requests_at', 'tokens', 'tokens_at')
local requests = math.min(rpm, (tonumber(b[1]) or rpm) + math.max(0, now - (tonumber(b[2]) or now)) * rpm / 60)
local tokens = math.min(tpm, (tonumber(b[3]) or tpm) + math.max(0, now - (tonumber(b[4]) or now)) * tpm / 60)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local in_flight = redis.call('ZCARD', KEYS[2])
local verdict = 'ok'
if in_flight >= most then
  verdict = 'concurrency'
elseif requests < 1 then
  verdict = 'requests'
elseif tokens < estimate then
  verdict = 'tokens'
else
  requests = requests - 1
  tokens = tokens - estimate
  redis.call('ZADD', KEYS[2], now + hold, ARGV[5])
  redis.call('EXPIRE', KEYS[2], math.ceil(hold) + 1)
  in_flight = in_flight + 1
end
redis.call('HSET', KEYS[1], 'requests', requests, 'requests_at', now, 'tokens', tokens, 'tokens_at', now)
-- A full bucket is the same as no key: keep it only until it would be full again.
local full_in = math.max((rpm - requests) * 60 / rpm, (tpm - tokens) * 60 / tpm)
redis.call('EXPIRE', KEYS[1], math.ceil(full_in) + 1)
return {verdict, tostring(requests), tostring(tokens), in_flight}
"""

# KEYS: as ADMIT's. ARGV: request id, tokens/min, tokens used beyond the estimate ('' = estimate stands).
SETTLE = """
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[3] == '' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tpm = tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'tokens_at')
local tokens = math.min(tpm, (tonumber(b[1]) or tpm) + math.max(0, now - (tonumber(b[2]) or now)) * tpm / 60)
tokens = tokens - tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'tokens', tokens, 'tokens_at', now)
local full_in = math.ceil((tpm - tokens) * 60 / tpm) + 1
if redis.call('TTL', KEYS[1]) < full_in then redis.call('EXPIRE', KEYS[1], full_in) end
return 1
"""


class RedisQuotas(Quotas):
    """Quotas in a Redis every gateway of the stack shares (``quota.store: redis``)."""

    def __init__(self, config: QuotaConfig, hold_s: float, client: Any | None = None) -> None:
        if client is None:
            import redis.asyncio

            client = redis.asyncio.Redis.from_url(
                config.redis_url, socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s
            )
        self._redis = client
        self._prefix = config.key_prefix
        self._hold_s = hold_s  # an in-flight entry outlives any request it stands for
        self._admit = client.register_script(ADMIT)
        self._settle = client.register_script(SETTLE)
        self._pending: set[asyncio.Task[None]] = set()

    def _keys(self, tenant: str) -> list[str]:
        # One hash tag per tenant keeps both keys in one slot of a Redis cluster.
        return [f"{self._prefix}:{{{tenant}}}:buckets", f"{self._prefix}:{{{tenant}}}:in_flight"]

    async def admit(self, tenant: Tenant, estimated_tokens: int, request_id: str) -> Grant | Refusal:
        args: list[str | int | float] = [
            tenant.requests_per_minute,
            tenant.tokens_per_minute,
            tenant.max_concurrent_requests,
            estimated_tokens,
            request_id,
            self._hold_s,
        ]
        try:
            verdict, requests, tokens, in_flight = await self._admit(keys=self._keys(tenant.name), args=args)
        except Exception as exc:  # noqa: BLE001 - any client or server failure means no answer
            raise QuotaStoreError(f"the quota store did not answer: {type(exc).__name__}") from exc
        levels = Levels(tenant, float(requests), float(tokens))
        verdict = verdict.decode() if isinstance(verdict, bytes) else str(verdict)
        if verdict != "ok":
            return refusal(verdict, levels, int(in_flight), estimated_tokens)
        return Grant(tenant, request_id, estimated_tokens, levels, self._release)

    def _release(self, grant: Grant, used_tokens: int | None) -> asyncio.Task[None]:
        # Called where the answer ends, which may be a generator's cleanup: the update runs as a
        # task, kept until done and awaited at shutdown.
        delta = "" if used_tokens is None else str(used_tokens - grant.tokens_taken)
        args = [grant.request_id, grant.tenant.tokens_per_minute, delta]
        task = asyncio.get_running_loop().create_task(self._settle_in_store(grant, args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _settle_in_store(self, grant: Grant, args: list[Any]) -> None:
        try:
            await self._settle(keys=self._keys(grant.tenant.name), args=args)
        except Exception:  # noqa: BLE001 - the in-flight entry expires on its own
            log.exception(
                "quota settlement failed",
                extra={
                    "event": "quota_settle_failed",
                    "tenant": grant.tenant.name,
                    "request_id": grant.request_id,
                },
            )

    async def settled(self) -> None:
        """Wait for the settlements started so far."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def aclose(self) -> None:
        await self.settled()
        await self._redis.aclose()


def open_quotas(
    config: QuotaConfig, tenants: list[Tenant], hold_s: float, *, secrets: Any | None = None
) -> Quotas:
    if config.store == "redis" and config.redis_auth_secret:
        return RedisQuotas(config, hold_s, client=authenticated_client(config, secrets))
    if config.store == "redis":
        return RedisQuotas(config, hold_s)
    return MemoryQuotas(tenants)


def store_connection(config: QuotaConfig, secrets: Any | None = None) -> tuple[str, str]:
    """The store's URL and AUTH password from ``quota.redis_auth_secret`` (the URL from the config
    where it names one): ``{"password": "…", "url": "rediss://…"}``."""
    secret_id = config.redis_auth_secret
    if secrets is None:
        import boto3

        secrets = boto3.client("secretsmanager")
    try:
        text = secrets.get_secret_value(SecretId=secret_id)["SecretString"]
    except Exception as exc:  # noqa: BLE001 - any failure to read it is the same for the operator
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        raise QuotaStoreError(
            f"cannot read the quota store's AUTH token from secret {secret_id!r}: {code}"
        ) from None
    try:
        document = json.loads(text)
        password, url = document["password"], config.redis_url or document["url"]
    except (ValueError, KeyError, TypeError):
        shape = '{"password": "..."}' if config.redis_url else '{"password": "...", "url": "rediss://..."}'
        raise QuotaStoreError(f"secret {secret_id!r} must hold {shape}") from None
    if not isinstance(password, str) or not password or not isinstance(url, str) or not url:
        raise QuotaStoreError(f"secret {secret_id!r}: password and url must be non-empty strings")
    return url, password


def authenticated_client(config: QuotaConfig, secrets: Any | None = None) -> Any:
    """A client that presents the secret's AUTH token, checked once here: a wrong token is a setting
    no retry mends, so the gateway stops at start naming the secret rather than answer 503 to every
    request. A store not reachable yet is not checked: requests meet it once it is."""
    import redis
    import redis.asyncio

    url, password = store_connection(config, secrets)
    timeout = config.timeout_s
    probe = redis.Redis.from_url(
        url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        probe.ping()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        raise QuotaStoreError(
            f"the quota store at {url} refused the AUTH token from secret {config.redis_auth_secret!r}: {exc}"
        ) from None
    except redis.RedisError as exc:
        log.warning(
            "quota store not reachable at start",
            extra={"event": "quota_store_unreachable", "url": url, "error": type(exc).__name__},
        )
    finally:
        probe.close()
    return redis.asyncio.Redis.from_url(
        url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout
    )


def format_duration(seconds: float) -> str:
    """OpenAI's style: "120ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def estimate_tokens(body: dict[str, Any], default_max_tokens: int) -> int:
    """Tokens counted up front: prompt characters / 4 (at least 1) plus the completion length asked for."""
    chars = 0
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        chars = len(prompt)
    elif isinstance(prompt, list):
        chars = sum(
            len(p) if isinstance(p, str) else 4 * len(p) if isinstance(p, list) else 4 for p in prompt
        )
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(part.get("text", "")) for part in content if isinstance(part, dict))
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    if not isinstance(completion, int) or completion < 1:
        completion = default_max_tokens
    return max(1, math.ceil(chars / 4)) + completion
