"""Alerts and the resource metrics they read, per consumer.

* Prometheus alerting rules from the stack's SLOs and the GPU and host resources, on the metric
  names the runtime, the DCGM exporter and the node exporter export; each rule carries the
  ``alarm`` it is (a name of :data:`~frontier.config.schema.ALARM_SEVERITIES`) and its ``severity``
  (the stack's ``alerts.severities``, else the default table), which Alertmanager routes by.
* The CloudWatch agent's metrics section for an EC2 node group: host CPU, memory, network, the
  weights cache's disk, the runtime process, and NVIDIA GPU metrics on GPU groups only.

The same alarm names appear on every target: a CloudWatch alarm ``frontier-<stack>-<alarm>``, a
PrometheusRule alert labelled ``alarm: <alarm>``, and the local stack's evaluator's messages. The
named alarms of :mod:`frontier.alarms` are rendered from their declaration (:func:`named_rules`).
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier_hostside import names
from frontier_hostside.names import CACHE_MOUNT, CLOUDWATCH_DIMENSIONS, CLOUDWATCH_NAMESPACE

from frontier.alarms import HOSTS, NAMED_ALARMS, Scope
from frontier.config.schema import ALARM_SEVERITIES, NodeGroup, Settings, Severity
from frontier.render.templates import render_template


@dataclass(frozen=True)
class NamedRule:
    """One named alarm as a Prometheus rule of this stack."""

    alarm: str
    severity: Severity
    alert: str
    expr: str
    for_: str
    summary: str
    description: str


def named_rules(settings: Settings, scope: Scope = HOSTS) -> list[NamedRule]:
    rules = []
    for alarm in NAMED_ALARMS.values():
        rule = alarm.prometheus(settings, scope)
        rules.append(
            NamedRule(
                alarm.name,
                alarm.severity(settings),
                rule.alert,
                rule.expr,
                rule.for_,
                rule.summary,
                rule.description,
            )
        )
    return rules


# Metric names the alert rules read, as the runtime exports them (histograms by their buckets).
METRICS = {
    "e2e_bucket": f"{names.E2E_LATENCY_METRIC}_bucket",
    "http_requests_total": f"{names.HTTP_REQUESTS_METRIC}_total",
    "waiting": names.WAITING_METRIC,
}

# What the resource rules read on Kubernetes: NVIDIA's DCGM exporter (its default counters) and the
# node exporter of the Prometheus stack.
RESOURCE_METRICS = {
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL",
    "fb_used": "DCGM_FI_DEV_FB_USED",  # MiB
    "fb_free": "DCGM_FI_DEV_FB_FREE",  # MiB
    "gpu_temp": "DCGM_FI_DEV_GPU_TEMP",  # degrees C
    "gpu_power": "DCGM_FI_DEV_POWER_USAGE",  # W
    "mem_available": "node_memory_MemAvailable_bytes",
    "mem_total": "node_memory_MemTotal_bytes",
    "fs_avail": "node_filesystem_avail_bytes",
    "fs_size": "node_filesystem_size_bytes",
    "cpu_seconds": "node_cpu_seconds_total",
    "net_rx": "node_network_receive_bytes_total",
    "net_tx": "node_network_transmit_bytes_total",
}

# Host and GPU metrics on EC2 (the CloudWatch agent) and on the local stack (its evaluator): the
# runtime's namespace and dimensions (Stack, NodeGroup), the agent's own metric names. The same
# namespace as the bootstrap's publisher: the only one the runtime hosts' role may put metrics in.
HOST_NAMESPACE = CLOUDWATCH_NAMESPACE
CPU_ACTIVE = "cpu_usage_active"  # percent
MEM_USED = "mem_used_percent"
DISK_USED = "disk_used_percent"
NET_SENT, NET_RECV = "net_bytes_sent", "net_bytes_recv"
GPU_UTIL = "nvidia_smi_utilization_gpu"  # percent
GPU_MEM_USED, GPU_MEM_TOTAL = "nvidia_smi_memory_used", "nvidia_smi_memory_total"  # MiB
GPU_TEMP = "nvidia_smi_temperature_gpu"  # degrees C
GPU_POWER = "nvidia_smi_power_draw"  # W
# The runtime process (the agent's procstat plugin; /proc on the local stack).
PROC_CPU_USER, PROC_CPU_SYSTEM = "procstat_cpu_time_user", "procstat_cpu_time_system"  # seconds
PROC_RSS = "procstat_memory_rss"  # bytes
# The runtime's command line on a host (the container's and the local slot's process alike).
RUNTIME_PROCESS_PATTERN = "frontier_runtime"
# The dimension the local stack adds: which host slot a process runs on.
HOST_DIMENSION = "Host"


@dataclass(frozen=True)
class ResourceLimits:
    """Thresholds of the resource alarms (fractions of 1, degrees C)."""

    # The runtime claims runtime.gpu_memory_utilization of each GPU at start: the alarm sits halfway
    # between that and full, so steady serving never trips it and a leak or a neighbour does.
    gpu_memory: float
    host_memory: float = 0.90
    cache_disk: float = 0.85
    gpu_temperature_c: float = 85.0


def resource_limits(settings: Settings) -> ResourceLimits:
    # A host runs one pool: halfway above the most any pool claims, so no pool's steady serving trips it.
    claimed = max(pool.runtime.gpu_memory_utilization for pool in settings.pools)
    return ResourceLimits(gpu_memory=round((1 + claimed) / 2, 4))


def severities(settings: Settings) -> dict[str, Severity]:
    """Every alarm's severity for this stack."""
    return {alarm: settings.alerts.severity(alarm) for alarm in ALARM_SEVERITIES}


def render_alerts(settings: Settings, scope: Scope = HOSTS) -> str:
    """Prometheus alerting rules from the stack's SLOs, on the runtime's metrics of ``scope``
    (the stack's namespace on Kubernetes; the hosts' job elsewhere)."""
    slo = settings.slo
    return render_template(
        "alerts.yaml.j2",
        stack=settings.stack,
        series={key: scope.runtime(metric) for key, metric in METRICS.items()},
        errors=scope.runtime(METRICS["http_requests_total"], 'status=~"5.."'),
        severity=severities(settings),
        ttft_s=slo.ttft_ms / 1000,
        p99_s=slo.p99_latency_ms / 1000,
        error_rate=slo.error_rate,
        queue_depth=settings.monitoring.queue_depth_alarm,
        named=named_rules(settings, scope),
    )


def render_resource_alerts(settings: Settings) -> str:
    """Prometheus alerting rules on GPU memory and temperature, host memory and the cache's disk."""
    return render_template(
        "resource-alerts.yaml.j2",
        stack=settings.stack,
        resources=RESOURCE_METRICS,
        severity=severities(settings),
        limits=resource_limits(settings),
    )


# --- the CloudWatch agent (EC2) -------------------------------------------------------------------


@dataclass(frozen=True)
class AgentMetrics:
    """What ``templates/cloudwatch-agent.json.j2`` collects on the hosts of one node group.

    Every series carries the runtime's dimensions (Stack, NodeGroup) and is also published rolled up
    over them, so an alarm or a dashboard reads one series per node group whichever hosts come and
    go. GPU metrics only where the group has GPUs: the agent's ``nvidia_gpu`` plugin needs
    ``nvidia-smi``.
    """

    namespace: str
    dimensions: dict[str, str]
    gpu: bool
    cache_mount: str
    process_pattern: str
    interval_s: int = 60


def agent_metrics(settings: Settings, group: NodeGroup) -> AgentMetrics:
    stack_dim, group_dim = CLOUDWATCH_DIMENSIONS
    return AgentMetrics(
        namespace=HOST_NAMESPACE,
        dimensions={stack_dim: settings.stack, group_dim: group.name},
        gpu=group.accelerator == "gpu",
        cache_mount=CACHE_MOUNT,
        process_pattern=RUNTIME_PROCESS_PATTERN,
    )
