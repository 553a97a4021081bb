"""/metrics: vLLM-compatible names and buckets, refusals by reason, requests by status."""

from __future__ import annotations

import re

import httpx
from frontier_hostside import names
from frontier_runtime.server.metrics import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
from prometheus_client.parser import text_string_to_metric_families
from server_harness import MODEL


def _scrape(url: str) -> dict[str, list]:
    text = httpx.get(f"{url}/metrics").text
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _buckets(samples: list, name: str) -> list[float]:
    return sorted(
        {float(s.labels["le"]) for s in samples if s.name == f"{name}_bucket" and s.labels["le"] != "+Inf"}
    )


def test_vllm_names_are_exported_before_any_request(serve) -> None:
    families = _scrape(serve().url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:num_preemptions",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "frontier_batch_size",
        "frontier_request_failures",
        "frontier_http_requests",
        "frontier_http_request_duration_seconds",
    ):
        assert name in families, name
    reasons = {s.labels["reason"] for s in families["frontier_request_failures"]}
    assert {"queue_full", "queue_timeout", "invalid", "unauthorized", "draining"} <= reasons


def test_the_shared_names_name_every_exported_family(serve) -> None:
    exported = {name for name in _scrape(serve().url) if not name.endswith("_created")}
    assert exported == set(names.RUNTIME_METRIC_NAMES)
    assert len(set(names.RUNTIME_METRIC_NAMES)) == len(names.RUNTIME_METRIC_NAMES)


def test_histograms_use_the_llm_latency_buckets(serve) -> None:
    families = _scrape(serve().url)
    assert _buckets(families["vllm:time_to_first_token_seconds"], "vllm:time_to_first_token_seconds") == list(
        TTFT_BUCKETS
    )
    assert _buckets(families["vllm:inter_token_latency_seconds"], "vllm:inter_token_latency_seconds") == list(
        TOKEN_LATENCY_BUCKETS
    )
    assert _buckets(families["vllm:e2e_request_latency_seconds"], "vllm:e2e_request_latency_seconds") == list(
        REQUEST_LATENCY_BUCKETS
    )
    assert _buckets(families["vllm:request_queue_time_seconds"], "vllm:request_queue_time_seconds") == list(
        REQUEST_LATENCY_BUCKETS
    )
    assert TTFT_BUCKETS[:3] == (0.001, 0.005, 0.01) and TTFT_BUCKETS[-1] == 2560.0


def test_a_served_request_moves_the_counters(serve, codec) -> None:
    srv = serve()
    prompt = "the cache and the engine"
    httpx.post(
        f"{srv.url}/v1/completions", json={"prompt": prompt, "max_tokens": 5, "ignore_eos": True}
    ).raise_for_status()
    httpx.post(f"{srv.url}/v1/completions", json={"prompt": prompt, "temperature": 9})
    srv.wait_idle()
    families = _scrape(srv.url)

    def value(name: str, sample: str, **labels: str) -> float:
        return sum(
            s.value
            for s in families[name]
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
        )

    assert value("vllm:prompt_tokens", "vllm:prompt_tokens_total", model_name=MODEL) == len(
        codec.encode(prompt)
    )
    assert value("vllm:generation_tokens", "vllm:generation_tokens_total") == 5
    assert value("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 1
    assert value("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 1
    assert value("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 4
    assert value("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == 1
    assert (
        value("frontier_http_requests", "frontier_http_requests_total", route="/v1/completions", status="200")
        == 1
    )
    assert (
        value("frontier_http_requests", "frontier_http_requests_total", route="/v1/completions", status="400")
        == 1
    )
    assert value("frontier_request_failures", "frontier_request_failures_total", reason="invalid") == 1
    assert value("vllm:num_requests_running", "vllm:num_requests_running") == 0
    assert value("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc") == 0.0
    assert value("frontier_ready", "frontier_ready") == 1


def test_unknown_paths_share_one_label(serve) -> None:
    srv = serve()
    for i in range(3):
        httpx.get(f"{srv.url}/scan/{i}")
    text = httpx.get(f"{srv.url}/metrics").text
    assert 'frontier_http_requests_total{route="other",status="404"} 3.0' in text
    assert not re.search(r'route="/scan', text)


def test_probes_and_scrapes_are_not_counted_as_traffic(serve) -> None:
    srv = serve()
    srv.state.health.draining = True
    assert httpx.get(f"{srv.url}/health/ready").status_code == 503
    httpx.get(f"{srv.url}/health/live")
    text = httpx.get(f"{srv.url}/metrics").text
    assert 'route="/health' not in text and 'route="/metrics"' not in text


def test_a_cpu_host_exports_no_gpus_and_no_gpu_series(serve) -> None:
    families = _scrape(serve().url)
    assert [s.value for s in families[names.GPUS_METRIC]] == [0]
    assert not set(names.GPU_METRIC_NAMES) & set(families)  # no utilisation of 0 for a GPU that is not there
