"""The usage table ``fab usage`` and the demo print: tenant x model, requests, tokens, cost."""

from __future__ import annotations

from rich.table import Table

from frontier.access.usage import Usage
from frontier.tables import table


def usage_table(stack: str, uri: str, rows: list[Usage], prices: dict[str, float]) -> Table:
    body = [
        (
            r.tenant,
            r.model,
            f"{r.requests:,}",
            f"{r.errors:,}",
            f"{r.prompt_tokens:,}",
            f"{r.completion_tokens:,}",
            f"{r.p50_latency_ms:,.0f}",
            f"${prices.get(r.model, 0.0) * 1e6:,.2f}",
            f"${r.cost_usd:,.6f}",
        )
        for r in rows
    ]
    if rows:
        body.append(
            (
                "total",
                "",
                f"{sum(r.requests for r in rows):,}",
                f"{sum(r.errors for r in rows):,}",
                f"{sum(r.prompt_tokens for r in rows):,}",
                f"{sum(r.completion_tokens for r in rows):,}",
                "",
                "",
                f"${sum(r.cost_usd for r in rows):,.6f}",
            )
        )
    columns = (
        "tenant",
        "model",
        "requests",
        "errors",
        "prompt tok",
        "completion tok",
        "p50 ms",
        "$/1M out tok",
        "cost",
    )
    return table(f"usage of {stack} ({uri})", columns, body, numeric=range(2, 9))
