"""Sum the gateway's metering records into usage per tenant and model, priced by the planner.

A record is one answered request (``frontier_gateway.metering.MeterRecord``). Cost is the
planner's price of an output token for the model's pool — a replica-hour's price over the output
tokens it makes in that hour at the measured (or assumed) per-replica rate — times the completion
tokens; prompt tokens are part of that replica-hour and carry no separate price.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frontier_gateway.metering import MeterRecord

from frontier.capacity.baseline import load_baseline
from frontier.capacity.plan import plan_stack
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.project import resolve


@dataclass
class Usage:
    tenant: str
    model: str
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: list[float] = field(default_factory=list)
    cost_usd: float = 0.0

    @property
    def p50_latency_ms(self) -> float:
        ordered = sorted(self.latency_ms)
        return ordered[len(ordered) // 2] if ordered else 0.0


@dataclass(frozen=True)
class Records:
    records: list[MeterRecord]
    skipped: list[str]  # "where: why" of every line that is not a record


def output_token_prices(settings: Settings) -> dict[str, float]:
    """USD per output token for each model, from the plan of its own pool."""
    baseline = load_baseline(settings.stack)
    prices = {}
    for i, pool in enumerate(settings.pools):
        # The stack's measured baseline is the first pool's (its load test ran against it).
        plan = plan_stack(settings, pool, baseline if i == 0 else None)
        prices[pool.name] = plan.groups[0].cost_per_million_output_tokens / 1e6
    return prices


def read_records(uri: str, *, s3: Any | None = None) -> Records:
    """Every record under ``uri``: a local JSON-lines file, or each object under s3://bucket/prefix."""
    if uri.startswith("s3://"):
        return _parse(_s3_lines(uri, s3))
    path = resolve(uri)
    if not path.exists():
        return Records([], [])
    return _parse((f"{path}:{n}", line) for n, line in enumerate(path.read_text().splitlines(), 1))


def _s3_lines(uri: str, s3: Any) -> Iterator[tuple[str, str]]:
    if s3 is None:
        raise FrontierError("reading metering from S3 needs an S3 client")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.strip("/")):
        for obj in page.get("Contents", []):
            text = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode()
            for n, line in enumerate(text.splitlines(), 1):
                yield f"s3://{bucket}/{obj['Key']}:{n}", line


def _parse(lines: Iterable[tuple[str, str]]) -> Records:
    records, skipped = [], []
    for where, line in lines:
        if not line.strip():
            continue
        try:
            records.append(MeterRecord(**json.loads(line)))
        except (ValueError, TypeError) as exc:
            # A gateway killed mid-write leaves at most a torn last line: counted, never summed.
            skipped.append(f"{where}: {type(exc).__name__}")
    return Records(records, skipped)


def sum_usage(records: Iterable[MeterRecord], prices: dict[str, float]) -> list[Usage]:
    """Rows by (tenant, model), sorted; requests answered with a status >= 400 count as errors."""
    rows: dict[tuple[str, str], Usage] = {}
    for r in records:
        row = rows.setdefault((r.tenant, r.model), Usage(r.tenant, r.model))
        row.requests += 1
        row.errors += r.status >= 400
        row.prompt_tokens += r.prompt_tokens
        row.completion_tokens += r.completion_tokens
        row.latency_ms.append(r.latency_ms)
        row.cost_usd += r.completion_tokens * prices.get(r.model, 0.0)
    return [rows[key] for key in sorted(rows)]


def metering_uri(settings: Settings) -> str:
    if settings.gateway is None:
        raise FrontierError(
            f"stack {settings.stack!r} has no gateway, so nothing is metered; add a 'frontier:gateway' section"
        )
    return settings.gateway.metering.uri


def local_path(uri: str) -> Path | None:
    return None if uri.startswith("s3://") else resolve(uri)
