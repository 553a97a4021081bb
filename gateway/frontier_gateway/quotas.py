"""Per-tenant quotas: requests/min and tokens/min as token buckets, and concurrent requests.

A bucket holds up to a minute's allowance and refills continuously, so a tenant may burst up to
its per-minute limit and then proceeds at the limit's rate. Tokens are taken up front (an estimate:
prompt characters / 4 + the requested completion length, as OpenAI counts max_tokens) and settled
with the runtime's usage when the answer ends, so a tenant pays for what it used; a request that
used more than estimated leaves the bucket in debt, paid back by refill.

Headers follow OpenAI's: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, reset as a
duration until the bucket is full again ("1s", "6m0s", "120ms").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from frontier_hostside import names

from frontier_gateway.tenants import Tenant


@dataclass
class Bucket:
    per_minute: int
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.per_minute, self.level + (now - self.updated) * self.per_minute / 60.0)
        self.updated = now

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, (self.per_minute - self.level) * 60.0 / self.per_minute)

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` can be taken (infinite when it exceeds a full bucket)."""
        if amount > self.per_minute:
            return math.inf
        return max(0.0, (amount - self.level) * 60.0 / self.per_minute)


@dataclass(frozen=True)
class Refusal:
    limit: str  # requests | tokens | concurrency
    message: str
    retry_after_s: float


@dataclass
class TenantQuota:
    tenant: Tenant
    requests: Bucket
    tokens: Bucket
    in_flight: int = 0


@dataclass
class Grant:
    """What one admitted request holds; ``settle`` once with the tokens it really used."""

    quota: TenantQuota
    tokens_taken: int
    _clock: Callable[[], float]
    settled: bool = field(default=False)

    def settle(self, used_tokens: int | None) -> None:
        if self.settled:
            return
        self.settled = True
        self.quota.in_flight -= 1
        if used_tokens is not None:
            self.quota.tokens.refill(self._clock())
            self.quota.tokens.level -= used_tokens - self.tokens_taken


class Quotas:
    def __init__(self, tenants: list[Tenant], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._quotas = {
            t.name: TenantQuota(
                t,
                Bucket(t.requests_per_minute, t.requests_per_minute, now),
                Bucket(t.tokens_per_minute, t.tokens_per_minute, now),
            )
            for t in tenants
        }

    def quota(self, tenant: Tenant) -> TenantQuota:
        return self._quotas[tenant.name]

    def admit(self, tenant: Tenant, estimated_tokens: int) -> Grant | Refusal:
        """Take one request and ``estimated_tokens`` tokens, or refuse without taking anything."""
        q = self._quotas[tenant.name]
        now = self._clock()
        q.requests.refill(now)
        q.tokens.refill(now)
        if q.in_flight >= tenant.max_concurrent_requests:
            return Refusal(
                "concurrency",
                f"Rate limit reached for tenant {tenant.name!r} on concurrent requests: limit "
                f"{tenant.max_concurrent_requests}, in flight {q.in_flight}. Retry when one finishes.",
                1.0,
            )
        if q.requests.level < 1:
            wait = q.requests.wait_s(1)
            return Refusal(
                "requests",
                f"Rate limit reached for tenant {tenant.name!r} on requests per min (RPM): limit "
                f"{tenant.requests_per_minute}, used {tenant.requests_per_minute - math.floor(q.requests.level)}. "
                f"Please try again in {format_duration(wait)}.",
                wait,
            )
        if q.tokens.level < estimated_tokens:
            wait = q.tokens.wait_s(estimated_tokens)
            too_big = math.isinf(wait)
            return Refusal(
                "tokens",
                f"Rate limit reached for tenant {tenant.name!r} on tokens per min (TPM): limit "
                f"{tenant.tokens_per_minute}, remaining {max(0, math.floor(q.tokens.level))}, requested "
                f"{estimated_tokens}. "
                + (
                    "The request is larger than the per-minute limit; lower max_tokens."
                    if too_big
                    else f"Please try again in {format_duration(wait)}."
                ),
                60.0 if too_big else wait,
            )
        q.requests.level -= 1
        q.tokens.level -= estimated_tokens
        q.in_flight += 1
        return Grant(q, estimated_tokens, self._clock)

    def headers(self, tenant: Tenant) -> dict[str, str]:
        q = self._quotas[tenant.name]
        now = self._clock()
        q.requests.refill(now)
        q.tokens.refill(now)
        return {
            names.LIMIT_REQUESTS: str(tenant.requests_per_minute),
            names.REMAINING_REQUESTS: str(max(0, math.floor(q.requests.level))),
            names.RESET_REQUESTS: format_duration(q.requests.reset_s()),
            names.LIMIT_TOKENS: str(tenant.tokens_per_minute),
            names.REMAINING_TOKENS: str(max(0, math.floor(q.tokens.level))),
            names.RESET_TOKENS: format_duration(q.tokens.reset_s()),
        }


def format_duration(seconds: float) -> str:
    """OpenAI's style: "120ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def estimate_tokens(body: dict, default_max_tokens: int) -> int:
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
