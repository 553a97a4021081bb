"""A stack's alerting rules read its own series only, as Prometheus's own rule engine evaluates them.

One Prometheus usually scrapes a cluster's every namespace, and every stack's runtimes carry the same
job: a rule that selected by the job alone would page production for staging's errors. Each test
renders the rules a stack deploys, writes synthetic series a failing runtime exports, and runs
``promtool test rules`` (Debian's prometheus package, from scripts/system-packages.sh): the alerts
it reports firing are what a cluster's Prometheus would fire, not a reading of the expressions.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from frontier_hostside import names

from frontier.alarms import probe_job_name
from frontier.config.schema import Settings
from frontier.render.alerts import render_alerts
from frontier.targets import load_stack
from frontier.targets.kubernetes import monitoring

OTHER_NAMESPACE = "frontier-staging"
MINUTES = 40  # series length; every rule's `for` has passed by EVAL
EVAL = "35m"
FIRING = 'count by (alertname) (ALERTS{alertstate="firing"})'


@dataclass(frozen=True)
class Exporter:
    """The labels a scrape gives one runtime's series: on Kubernetes its namespace and pod too."""

    instance: str
    namespace: str | None = None

    def labels(self, **more: str) -> str:
        found = {"job": "frontier-runtime", "instance": self.instance, **more}
        if self.namespace:
            found |= {"namespace": self.namespace, "pod": self.instance}
        return "{" + ",".join(f'{k}="{v}"' for k, v in found.items()) + "}"

    def series(self, metric: str, values: str, **labels: str) -> dict[str, str]:
        """One of this runtime's series as promtool's ``input_series`` takes it."""
        return {"series": metric + self.labels(**labels), "values": values}


def _counter(per_minute: float) -> str:
    return f"0+{per_minute}x{MINUTES}"


def _gauge(value: float) -> str:
    return f"{value}x{MINUTES}"


def _histogram(metric: str, runtime: Exporter, *, slow: bool) -> list[dict[str, str]]:
    """60 requests a minute, every one above the highest finite bound when ``slow``, else below the lowest."""
    return [
        runtime.series(f"{metric}_bucket", _counter(60 if (le == "+Inf" or not slow) else 0), le=le)
        for le in ("0.5", "60", "+Inf")
    ]


HTTP_REQUESTS = f"{names.HTTP_REQUESTS_METRIC}_total"


def failing(runtime: Exporter) -> list[dict[str, str]]:
    """What a runtime in every kind of trouble exports: slow, failing, queueing, full, not ready."""
    invalid = {names.REASON_LABEL: names.STRUCTURED_OUTPUT_INVALID}
    series = [
        runtime.series(HTTP_REQUESTS, _counter(60), status="500"),
        runtime.series(HTTP_REQUESTS, _counter(60), status="200"),
        runtime.series(names.WAITING_METRIC, _gauge(10_000)),
        runtime.series(names.KV_USAGE_METRIC, _gauge(0.999)),
        runtime.series(names.READY_METRIC, _gauge(0)),
        runtime.series(names.DRAINING_METRIC, _gauge(0)),
        runtime.series(names.PROCESS_START_METRIC, _gauge(0)),
        runtime.series(f"{names.STRUCTURED_OUTPUTS_METRIC}_total", _counter(20)),
        runtime.series(f"{names.REQUEST_FAILURES_METRIC}_total", _counter(10), **invalid),
        *_histogram(names.E2E_LATENCY_METRIC, runtime, slow=True),
        *_histogram(names.TTFT_METRIC, runtime, slow=True),
    ]
    if runtime.namespace:  # kube-state-metrics: the kubelet restarting the container every minute
        series.append(
            {
                "series": "kube_pod_container_status_restarts_total"
                f'{{container="{names.CONTAINER_NAME}",namespace="{runtime.namespace}",pod="{runtime.instance}"}}',
                "values": _counter(1),
            }
        )
    return series


def healthy(runtime: Exporter, settings: Settings) -> list[dict[str, str]]:
    """A runtime serving well, and its stack's probe succeeding every minute (test time starts at 0)."""
    series = [
        runtime.series(HTTP_REQUESTS, _counter(60), status="200"),
        runtime.series(names.WAITING_METRIC, _gauge(0)),
        runtime.series(names.KV_USAGE_METRIC, _gauge(0.2)),
        runtime.series(names.READY_METRIC, _gauge(1)),
        *_histogram(names.E2E_LATENCY_METRIC, runtime, slow=False),
        *_histogram(names.TTFT_METRIC, runtime, slow=False),
    ]
    if runtime.namespace:
        series.append(
            {
                "series": "kube_cronjob_status_last_successful_time"
                f'{{cronjob="{probe_job_name(settings.stack)}",namespace="{runtime.namespace}"}}',
                "values": _counter(60),
            }
        )
    return series


def fired(tmp_path: Path, rules: list[dict], series: list[dict[str, str]], expected: list[str]) -> None:
    """Run promtool over ``series``; fail unless exactly the alerts ``expected`` fire, once each."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: bash scripts/system-packages.sh installs Debian's prometheus"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": FIRING,
                        "eval_time": EVAL,
                        "exp_samples": [
                            {"labels": f'{{alertname="{a}"}}', "value": 1} for a in sorted(expected)
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def deployed_rules(settings: Settings) -> list[dict]:
    """The groups of the PrometheusRule the stack deploys beside its runtimes."""
    rule = monitoring.prometheus_rule(settings, settings.pools[0]).to_dict()
    return rule["spec"]["groups"]


def alert_names(groups: list[dict]) -> list[str]:
    return [rule["alert"] for group in groups for rule in group["rules"]]


@pytest.fixture(scope="module")
def eks_prod() -> Settings:
    return load_stack("eks-prod")


def test_another_namespaces_failing_runtimes_raise_none_of_this_stacks_alerts(tmp_path, eks_prod):
    ours = eks_prod.kubernetes.namespace
    assert ours != OTHER_NAMESPACE
    series = [*failing(Exporter("staging-0", OTHER_NAMESPACE)), *healthy(Exporter("prod-0", ours), eks_prod)]
    fired(tmp_path, deployed_rules(eks_prod), series, expected=[])


def test_its_own_namespaces_failing_runtime_raises_every_one_of_its_alerts(tmp_path, eks_prod):
    groups = deployed_rules(eks_prod)
    # The probe's CronJob never succeeded there either: its alarm fires on the series being absent.
    fired(tmp_path, groups, failing(Exporter("prod-0", eks_prod.kubernetes.namespace)), alert_names(groups))


def test_on_hosts_scraped_outside_a_cluster_the_same_rules_fire_on_the_hosts_series(tmp_path):
    """``monitoring/alerts.yaml`` as ``fab render`` writes it for an EC2 stack: no namespace to scope
    by, and a crash loop read from the process's own starts, since no kubelet counts them."""
    settings = load_stack("prod")
    groups = yaml.safe_load(render_alerts(settings))["groups"]
    restarting = Exporter("10.0.1.9:8000")
    series = [
        *failing(Exporter("10.0.1.8:8000")),
        restarting.series(names.PROCESS_START_METRIC, _counter(60)),
    ]
    fired(tmp_path, groups, series, alert_names(groups))
