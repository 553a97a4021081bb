"""The panels of a stack's dashboard, once for every target.

Each panel names what it shows in PromQL (the Grafana dashboard of the Prometheus stack on
Kubernetes) and in CloudWatch series (the CloudWatch dashboard on EC2, see :mod:`infra.monitoring`):
same titles, same figures. The serving panels read the runtime's own metrics; the resource panels
read the DCGM and node exporters on Kubernetes and the CloudWatch agent on EC2
(:mod:`frontier.render.alerts`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from frontier_hostside import names

from frontier.alarms import HOSTS, Scope
from frontier.config.schema import Settings
from frontier.render import alerts as a
from frontier.render.templates import render_template


@dataclass(frozen=True)
class Series:
    """One CloudWatch series of a panel: a metric of the runtime's namespace and its statistic."""

    metric: str
    stat: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana's unit id
    promql: tuple[str, ...]
    # Empty: on EC2 the panel's figures come from AWS's own namespaces (the load balancer's).
    cloudwatch: tuple[Series, ...] = ()


def serving_panels(scope: Scope = HOSTS) -> tuple[Panel, ...]:
    """The runtime's own series, of ``scope``'s runtimes only (the stack's namespace on Kubernetes)."""
    requests = scope.runtime(f"{names.HTTP_REQUESTS_METRIC}_total")
    failed = scope.runtime(f"{names.HTTP_REQUESTS_METRIC}_total", 'status=~"5.."')
    waiting = scope.runtime(names.WAITING_METRIC)

    def p99(histogram: str) -> str:
        return f"histogram_quantile(0.99, sum by (le) (rate({scope.runtime(f'{histogram}_bucket')}[5m])))"

    return (
        Panel("Requests / s", "reqps", (f"sum(rate({requests}[5m]))",)),
        Panel(
            "5xx / requests",
            "percentunit",
            (f"sum(rate({failed}[5m])) / clamp_min(sum(rate({requests}[5m])), 1e-9)",),
        ),
        Panel(
            "p99 latency and time to first token (s)",
            "s",
            (p99(names.E2E_LATENCY_METRIC), p99(names.TTFT_METRIC)),
            (Series(names.E2E_LATENCY_CW_METRIC, "p99"),),
        ),
        Panel(
            "Runtime queue depth",
            "short",
            (f"max({waiting})", f"avg({waiting})"),
            (Series(names.QUEUE_DEPTH_METRIC, "Maximum"), Series(names.QUEUE_DEPTH_METRIC, "Average")),
        ),
    )


# The GPUs' and the nodes' series: a node's, whichever stack's pods it runs.
NODE_PANELS = (
    Panel(
        "GPU utilisation (%)",
        "percent",
        (f"avg({a.RESOURCE_METRICS['gpu_util']})", f"max({a.RESOURCE_METRICS['gpu_util']})"),
        (Series(a.GPU_UTIL, "Average"), Series(a.GPU_UTIL, "Maximum")),
    ),
    Panel(
        "GPU memory used (MiB)",
        "decmbytes",
        (
            f"max({a.RESOURCE_METRICS['fb_used']})",
            f"max({a.RESOURCE_METRICS['fb_used']} + {a.RESOURCE_METRICS['fb_free']})",
        ),
        (Series(a.GPU_MEM_USED, "Maximum"), Series(a.GPU_MEM_TOTAL, "Maximum")),
    ),
    Panel(
        "GPU temperature (C) and power (W)",
        "short",
        (f"max({a.RESOURCE_METRICS['gpu_temp']})", f"sum({a.RESOURCE_METRICS['gpu_power']})"),
        (Series(a.GPU_TEMP, "Maximum"), Series(a.GPU_POWER, "Average")),
    ),
    Panel(
        "Host CPU (%)",
        "percent",
        (f'100 * (1 - avg(rate({a.RESOURCE_METRICS["cpu_seconds"]}{{mode="idle"}}[5m])))',),
        (Series(a.CPU_ACTIVE, "Average"), Series(a.CPU_ACTIVE, "Maximum")),
    ),
    Panel(
        "Host memory used (%)",
        "percent",
        (f"100 * max(1 - {a.RESOURCE_METRICS['mem_available']} / {a.RESOURCE_METRICS['mem_total']})",),
        (Series(a.MEM_USED, "Maximum"),),
    ),
    Panel(
        "Network (bytes / s)",
        "Bps",
        (
            f"sum(rate({a.RESOURCE_METRICS['net_rx']}[5m]))",
            f"sum(rate({a.RESOURCE_METRICS['net_tx']}[5m]))",
        ),
        (Series(a.NET_RECV, "Sum"), Series(a.NET_SENT, "Sum")),
    ),
    Panel(
        "Weights cache disk used (%)",
        "percent",
        (
            f'100 * max(1 - {a.RESOURCE_METRICS["fs_avail"]}{{mountpoint="/"}} / '
            f'{a.RESOURCE_METRICS["fs_size"]}{{mountpoint="/"}})',
        ),
        (Series(a.DISK_USED, "Maximum"),),
    ),
)


def resource_panels(scope: Scope = HOSTS) -> tuple[Panel, ...]:
    """The nodes' panels, then the runtime process's (the kubelet's container series, of ``scope``)."""
    container = f'container="{names.CONTAINER_NAME}"'
    return (
        *NODE_PANELS,
        Panel(
            "Runtime process CPU (s/s) and RSS (bytes)",
            "short",
            (
                f"sum(rate({scope.select('container_cpu_usage_seconds_total', container)}[5m]))",
                f"max({scope.select('container_memory_rss', container)})",
            ),
            (Series(a.PROC_CPU_USER, "Average"), Series(a.PROC_RSS, "Maximum")),
        ),
    )


def panels(scope: Scope = HOSTS) -> tuple[Panel, ...]:
    return serving_panels(scope) + resource_panels(scope)


def render_grafana_dashboard(settings: Settings, scope: Scope = HOSTS) -> str:
    """The stack's Grafana dashboard (JSON model), for the Grafana of the Prometheus stack; its
    runtime series those of ``scope`` (the stack's namespace on Kubernetes)."""
    text = render_template(
        "grafana-dashboard.json.j2",
        stack=settings.stack,
        uid=f"frontier-{settings.stack}"[:40],
        panels=panels(scope),
    )
    json.loads(text)  # a template typo fails here, not in Grafana
    return text
