"""Prometheus alerting rules from the stack's SLOs, on the metric names the runtime exports."""

from __future__ import annotations

from frontier_hostside import names

from frontier.config.schema import Settings
from frontier.render.templates import render_template

# Metric names the alert rules read, as the runtime exports them (histograms by their buckets).
METRICS = {
    "ttft_bucket": f"{names.TTFT_METRIC}_bucket",
    "e2e_bucket": f"{names.E2E_LATENCY_METRIC}_bucket",
    "http_requests_total": f"{names.HTTP_REQUESTS_METRIC}_total",
    "waiting": names.WAITING_METRIC,
    "kv_usage": names.KV_USAGE_METRIC,
    "ready": names.READY_METRIC,
}


def render_alerts(settings: Settings) -> str:
    """Prometheus alerting rules from the stack's SLOs."""
    slo = settings.slo
    return render_template(
        "alerts.yaml.j2",
        stack=settings.stack,
        metrics=METRICS,
        ttft_s=slo.ttft_ms / 1000,
        p99_s=slo.p99_latency_ms / 1000,
        error_rate=slo.error_rate,
        queue_depth=settings.monitoring.queue_depth_alarm,
        kv_usage=settings.monitoring.kv_usage_alarm,
    )
