"""Multi-turn chat through the official ``openai`` client: a conversation that resends its history
finds that history in the prefix cache, the hit shows in usage and in /metrics, and the load test's
table reads the hit rate from /metrics."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import MODEL

from frontier.loadtest.client import Target
from frontier.loadtest.report import ServedStep, prefix_cache_counters, steps_table
from frontier.loadtest.stats import SloTargets, summarize

SLO = SloTargets(ttft_ms=1000, tpot_ms=100, p99_latency_ms=5000, error_rate=0.01)
SYSTEM = (
    "You are the on-call assistant of a cluster that serves language models. Answer with the "
    "host, the release and the next step; keep every answer short and never guess a host name."
)


@pytest.fixture(scope="module")
def client(shared_server):
    with openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _counters(url: str) -> tuple[float, float]:
    got = prefix_cache_counters(Target(base_url=url, model=MODEL))
    assert got is not None
    return got


def test_a_resent_history_hits_the_prefix_cache(client: openai.OpenAI, shared_server) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "which host is draining?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and what comes after the drain?"},
    ]
    queries0, hits0 = _counters(shared_server.url)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    queries1, hits1 = _counters(shared_server.url)

    block = shared_server.state.config.block_size
    cached = second.usage.prompt_tokens_details.cached_tokens
    # At least every full block of the first turn's prompt is reused.
    assert cached >= (first.usage.prompt_tokens // block) * block - block
    assert cached > 0 and cached % block == 0
    assert queries1 - queries0 == second.usage.prompt_tokens
    assert hits1 - hits0 == cached


def test_the_load_test_table_shows_the_hit_rate(shared_server) -> None:
    metrics = httpx.get(f"{shared_server.url}/metrics").text
    assert "vllm:prefix_cache_hits_total" in metrics and "vllm:prefix_cache_queries_total" in metrics
    step = summarize([], window=(0.0, 1.0), slo=SLO, offered_rps=1.0)
    fields = {name: getattr(step, name) for name in step.__dataclass_fields__}
    table = steps_table([ServedStep(**fields, prefix_cache_hit_rate=0.42)], SLO)
    (column,) = [c for c in table.columns if c.header == "prefix hit"]
    assert list(column.cells) == ["42%"]


def test_unreadable_metrics_leave_the_column_empty() -> None:
    assert prefix_cache_counters(Target(base_url="http://127.0.0.1:9", model=MODEL)) is None
