"""Monitoring of the runtime on Kubernetes: its scrape (ServiceMonitor) and its alerts (PrometheusRule).

The alerts are the same rules ``fab render`` writes for every stack (``templates/alerts.yaml.j2``,
from the stack's SLOs), handed to the Prometheus Operator. They select the runtime by
``job="frontier-runtime"``: the ServiceMonitor takes its job name from the Service's
``app.kubernetes.io/name`` label, which is exactly that, so one set of rules serves every target.
"""

from __future__ import annotations

import yaml
from frontier_hostside.names import K8S_APP_LABEL

from frontier.config.schema import Settings
from frontier.render.alerts import render_alerts
from frontier.targets.kubernetes.objects import Manifest, app_labels, app_name, kubernetes_of, selector


def service_monitor(settings: Settings) -> Manifest:
    k = kubernetes_of(settings)
    body = {
        "spec": {
            "jobLabel": K8S_APP_LABEL,
            "selector": {"matchLabels": selector(settings)},
            "namespaceSelector": {"matchNames": [k.namespace]},
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "scheme": "http",
                    "interval": f"{k.monitoring.scrape_interval_s}s",
                }
            ],
        }
    }
    return Manifest(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        app_name(settings),
        k.namespace,
        body,
        labels={**app_labels(settings), **k.monitoring.service_monitor_labels},
    )


def prometheus_rule(settings: Settings) -> Manifest:
    k = kubernetes_of(settings)
    rules = yaml.safe_load(render_alerts(settings))
    return Manifest(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        f"{app_name(settings)}-alerts",
        k.namespace,
        {"spec": {"groups": rules["groups"]}},
        # The operator selects rules by the same labels as ServiceMonitors in common setups.
        labels={**app_labels(settings), **k.monitoring.service_monitor_labels},
    )
