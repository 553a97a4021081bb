"""The synthetic probe on Kubernetes: a CronJob per model that sends the fixed request of
``frontier_hostside/probe.py`` for its model through the stack's public endpoint (the Ingress's
host) every minute, from the runtime's own image (``python -m frontier_runtime.probe``), and the
NetworkPolicy of their pods.

The job's exit status is the probe's outcome: kube-state-metrics (of the Prometheus stack)
publishes the CronJob's last successful run, which the ``probe-failing`` rule reads
(:mod:`frontier.alarms`); each run's JSON line (status, error, latency) is in its pod's log. It runs
as the service account of the pool whose key it presents, so it reads that key from Secrets Manager
as the runtime does (each pool's CronJob as that pool's), and goes out as a client does: DNS, then
HTTPS to the public address.
"""

from __future__ import annotations

import copy
import re

from frontier_hostside import probe
from frontier_hostside.names import K8S_APP_LABEL, K8S_INSTANCE_LABEL, K8S_MANAGED_BY_LABEL

from frontier.alarms import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, probe_job_name
from frontier.config.schema import PoolSettings, Settings
from frontier.targets.kubernetes.network_policies import common_egress
from frontier.targets.kubernetes.objects import RESTRICTED_CONTAINER, Manifest, kubernetes_of

PROBE_APP = "frontier-probe"
# A run that has not finished by then is a failed one; the next minute starts afresh.
ACTIVE_DEADLINE_S = PROBE_TIMEOUT_S * 2
HISTORY = 3


def probe_selector() -> dict[str, str]:
    """Every probe pod of the namespace (one stack's)."""
    return {K8S_APP_LABEL: PROBE_APP, K8S_MANAGED_BY_LABEL: "frontier"}


def cron_job_name(settings: Settings, pool: PoolSettings) -> str:
    """``frontier-<stack>-probe``; ``-<model>`` after it where the stack serves several models."""
    if len(settings.pools) == 1:
        return probe_job_name(settings.stack)
    slug = re.sub(r"[^a-z0-9]+", "-", pool.name.lower()).strip("-")
    return f"{probe_job_name(settings.stack)}-{slug}"[:52].rstrip("-")  # a CronJob's name: 52 at most


def probe_endpoint(settings: Settings) -> str:
    return f"https://{kubernetes_of(settings).ingress.host}"


def probe_cron_job(
    settings: Settings, pool: PoolSettings, image: str, service_account: str, key_secret: str
) -> Manifest:
    """``pool``'s probe: ``image`` the runtime's, ``service_account`` the pool's, whose role reads the
    key it presents (``key_secret``)."""
    k = kubernetes_of(settings)
    name = cron_job_name(settings, pool)
    labels = {**probe_selector(), K8S_INSTANCE_LABEL: name}
    container = {
        "name": "probe",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "frontier_runtime.probe"],
        "env": [
            {"name": "AWS_REGION", "value": settings.region},
            {"name": "AWS_DEFAULT_REGION", "value": settings.region},
            {"name": probe.ENDPOINT_ENV, "value": probe_endpoint(settings)},
            {"name": probe.MODELS_ENV, "value": pool.name},
            {"name": probe.STACK_ENV, "value": settings.stack},
            {"name": probe.KEY_SECRET_ENV, "value": key_secret},
            {"name": probe.TIMEOUT_ENV, "value": str(PROBE_TIMEOUT_S)},
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"cpu": "500m", "memory": "512Mi"},
        },
        "securityContext": copy.deepcopy(RESTRICTED_CONTAINER),
    }
    pod = {
        "metadata": {"labels": dict(labels)},
        "spec": {
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": k.run_as_user,
                "runAsGroup": k.run_as_user,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
        },
    }
    body = {
        "spec": {
            "schedule": f"*/{PROBE_INTERVAL_S // 60} * * * *",
            # A run still going when the next is due is a failing one: never two at once.
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": PROBE_INTERVAL_S,
            "successfulJobsHistoryLimit": HISTORY,
            "failedJobsHistoryLimit": HISTORY,
            "jobTemplate": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    # One try per minute: a retry would hide the failure the alarm counts.
                    "backoffLimit": 0,
                    "activeDeadlineSeconds": ACTIVE_DEADLINE_S,
                    "ttlSecondsAfterFinished": HISTORY * PROBE_INTERVAL_S * 5,
                    "template": pod,
                },
            },
        }
    }
    return Manifest("batch/v1", "CronJob", name, k.namespace, body, labels=labels)


def probe_network_policy(settings: Settings) -> Manifest:
    """Out as a runtime goes (DNS, HTTPS, the identity agent), in from nothing."""
    k = kubernetes_of(settings)
    labels = {**probe_selector(), K8S_INSTANCE_LABEL: probe_job_name(settings.stack)}
    return Manifest(
        "networking.k8s.io/v1",
        "NetworkPolicy",
        f"{probe_job_name(settings.stack)}-egress",
        k.namespace,
        {
            "spec": {
                "podSelector": {"matchLabels": probe_selector()},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": common_egress(settings),
            }
        },
        labels=labels,
    )
