"""A Kubernetes pool keeps its replicas at a steady load: beside the queue (empty whenever nothing
waits), the HPA holds the running requests at the group's scale_in_utilisation of each replica's
concurrency, and takes the larger of the two."""

from __future__ import annotations

import math

from frontier.targets import load_stack
from frontier.targets.kubernetes.autoscaling import scaled_object


def triggers(stack: str) -> dict[str, dict]:
    settings = load_stack(stack)
    return {t["name"]: t for t in scaled_object(settings, settings.only_pool).body["spec"]["triggers"]}


def hpa_replicas(total: float, threshold: float) -> int:
    """What an HPA asks of an AverageValue metric: the total over the per-replica target, rounded up."""
    return math.ceil(total / threshold)


def test_the_running_requests_trigger_holds_each_replica_at_its_scale_in_share_of_its_concurrency():
    settings = load_stack("eks-prod")
    running = triggers("eks-prod")["running"]
    assert running["metricType"] == "AverageValue"
    assert running["metadata"]["query"].startswith("sum(vllm:num_requests_running{")
    share = settings.runtime.max_concurrency * settings.serving_group.scale_in_utilisation
    assert float(running["metadata"]["threshold"]) == share


def test_at_a_steady_load_with_an_empty_queue_the_replicas_stay():
    settings = load_stack("eks-prod")
    running = triggers("eks-prod")["running"]
    threshold = float(running["metadata"]["threshold"])
    # Four replicas, each running 60 % of its concurrency (over the 50 % share): nothing waits.
    total = 4 * 0.6 * settings.runtime.max_concurrency
    queue = hpa_replicas(0, float(triggers("eks-prod")["queue-depth"]["metadata"]["threshold"]))
    assert max(queue, hpa_replicas(total, threshold)) >= 4


def test_a_light_load_lets_a_replica_go():
    settings = load_stack("eks-prod")
    threshold = float(triggers("eks-prod")["running"]["metadata"]["threshold"])
    total = 4 * 0.2 * settings.runtime.max_concurrency
    assert hpa_replicas(total, threshold) < 4


def test_a_third_trigger_scales_out_on_the_pools_ttft_p90_over_the_slo():
    settings = load_stack("eks-prod")
    latency = triggers("eks-prod")["ttft-p90"]
    assert latency["metricType"] == "AverageValue"
    query = latency["metadata"]["query"]
    # The ready replicas times the pool's p90 (not a per-replica figure), no traffic reading as 0.
    assert query.startswith('(sum(frontier_ready{namespace="frontier-prod",service="frontier-llama-3-1-70b-instruct"}) * (')
    assert "* ((histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{" in query
    assert query.endswith("> 0) or vector(0))) or vector(0)")
    assert float(latency["metadata"]["threshold"]) == settings.slo.ttft_ms / 1000


def test_a_ttft_p90_twice_the_slo_doubles_the_ready_replicas_with_nothing_waiting():
    threshold = float(triggers("eks-prod")["ttft-p90"]["metadata"]["threshold"])
    assert hpa_replicas(4 * (2 * threshold), threshold) == 8
    assert hpa_replicas(0, float(triggers("eks-prod")["queue-depth"]["metadata"]["threshold"])) == 0


def test_while_the_replicas_it_asked_for_load_the_latency_trigger_asks_for_no_more():
    # Four ready at twice the SLO asked for eight; four of them still load, the p90 is what it was.
    threshold = float(triggers("eks-prod")["ttft-p90"]["metadata"]["threshold"])
    ready, p90 = 4, 2 * threshold
    assert hpa_replicas(ready * p90, threshold) == 8  # not 16: the loading four count for nothing
    # (A Value metric would have asked current x p90 / SLO = 8 x 2 = 16 at the next scrape, then 32.)
