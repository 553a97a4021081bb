"""Alerts reach someone, end to end, on the local stack: real sshd, HAProxy, moto's server (SNS, SQS,
CloudWatch), the runtime deployed on a host slot, and the stack's alarm evaluator as a process.

host-1's runtime gets SIGKILL; the page queue subscribed to the page topic receives an ALARM naming
the alarm and the host, then an OK once the supervisor's restart answers its readiness check. The
stack file's short evaluation periods (``alerts.evaluation_interval_s``, ``runtime_down_for_s``) keep
it to seconds. Its ``runtime-restarts`` pages here (a warning elsewhere), so the same queue hears a
crash loop: a runtime killed again within the window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from frontier.alarms import RESTARTS_ALLOWED
from frontier.config.schema import Settings
from frontier.demo.alerts import page_queue_url, print_page_messages, receive
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import services
from frontier.targets.local.heal import kill_and_recover
from tests.e2e.deployed import up_with_first_release
from tests.e2e.stackcopy import write_local_stack


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One host slot over real sshd, HAProxy, moto and the alarm evaluator; release A deployed."""
    root = tmp_path_factory.mktemp("alarms")
    with pytest.MonkeyPatch.context() as mp:
        page_restarts = {"alerts": {"severities": {"runtime-restarts": "page"}}}
        mp.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(root, hosts=1, edit=page_restarts)))
        mp.delenv(local.CONNECTION_ENV, raising=False)
        settings = load_stack("local")
        try:
            up_with_first_release(settings, root)
            yield Deployed(settings)
        finally:
            local.down(settings)


@dataclass(frozen=True)
class Deployed:
    settings: Settings


@pytest.mark.e2e
@pytest.mark.slow
def test_the_alarm_evaluator_runs_as_a_service_of_the_local_stack(cluster):
    settings = cluster.settings
    assert services.find(local.state_dir(settings), "alarms") is not None
    assert page_queue_url(settings).endswith("/frontier-local-page")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rollout_pages_nobody(cluster):
    """The fixture's deploy restarted every runtime: hosts a rollout holds out raise no alarm."""
    quiet = receive(cluster.settings, lambda found: False, timeout_s=2)
    assert [m for m in quiet if m.state == "ALARM"] == []


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_runtime_pages_with_its_alarm_and_host_and_the_recovery_clears_it(cluster, capsys):
    settings = cluster.settings
    backend = backend_for(settings)
    host = backend.hosts()[0]
    receive(settings, lambda found: False, timeout_s=1)  # an empty queue to start from
    killed_at = time.time()
    recovery = kill_and_recover(settings, backend.pool, host, backend.balancer())
    with capsys.disabled():
        print(f"\n  kill -9 {host.name}: ready again after {recovery.ready_s:.2f}s")
        messages = print_page_messages(settings, host.name, killed_at, timeout_s=30)
    mine = [m for m in messages if m.host == host.name]
    assert [m.state for m in mine] == ["ALARM", "OK"]
    alarm, ok = mine
    assert alarm.alarm == ok.alarm == f"frontier-{settings.stack}-runtime-down"
    assert alarm.severity == "page" and alarm.old_state == "OK"
    # It fired once the runtime had been unready for runtime_down_for_s, and cleared when it answered.
    assert alarm.changed_at - killed_at >= settings.alerts.runtime_down_for_s
    assert killed_at < alarm.changed_at < ok.changed_at <= killed_at + recovery.ready_s + 2
    assert all(m.host == host.name for m in messages)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_runtime_its_supervisor_keeps_restarting_raises_runtime_restarts_once(cluster):
    settings = cluster.settings
    backend = backend_for(settings)
    host = backend.hosts()[0]
    receive(settings, lambda found: False, timeout_s=1)
    killed_at = time.time()
    for _ in range(RESTARTS_ALLOWED + 1):
        kill_and_recover(settings, backend.pool, host, backend.balancer())
    name = f"frontier-{settings.stack}-runtime-restarts"
    messages = receive(settings, lambda found: any(m.alarm == name for m in found), timeout_s=10)
    [fired] = [m for m in messages if m.alarm == name]
    assert (fired.state, fired.old_state, fired.host) == ("ALARM", "OK", host.name)
    assert fired.changed_at > killed_at and "restarted the runtime" in fired.reason


@pytest.mark.e2e
@pytest.mark.slow
def test_each_runtimes_cpu_seconds_and_rss_reach_cloudwatch_under_the_agents_names(cluster):
    settings = cluster.settings
    cloudwatch = local.aws_client(settings, "cloudwatch", actor="admin")
    now = datetime.now(UTC)
    for host in backend_for(settings).hosts():
        dimensions = [
            {"Name": "Stack", "Value": settings.stack},
            {"Name": "NodeGroup", "Value": settings.serving_group.name},
            {"Name": "Host", "Value": host.name},
        ]
        figures = {}
        for metric in ("procstat_memory_rss", "procstat_cpu_time_user"):
            points = cloudwatch.get_metric_statistics(
                Namespace="Frontier/Runtime",
                MetricName=metric,
                Dimensions=dimensions,
                StartTime=now - timedelta(minutes=10),
                EndTime=now + timedelta(minutes=1),
                Period=60,
                Statistics=["Maximum"],
            )["Datapoints"]
            figures[metric] = max(p["Maximum"] for p in points)
        # A runtime holding a torch model: tens of MB resident, and it has used the CPU.
        assert figures["procstat_memory_rss"] > 50 * 2**20, (host.name, figures)
        assert figures["procstat_cpu_time_user"] > 0, (host.name, figures)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_probe_answers_through_the_balancer_and_publishes_its_success(cluster):
    """Once release A serves, the evaluator's probe sends its fixed request through HAProxy with the
    stack's key and puts ProbeSuccess 1 and its latency into moto's CloudWatch, as the EC2 Lambda does."""
    settings = cluster.settings
    cloudwatch = local.aws_client(settings, "cloudwatch", actor="admin")
    now = datetime.now(UTC)

    def figures(metric: str) -> list[float]:
        return [
            p["Maximum"]
            for p in cloudwatch.get_metric_statistics(
                Namespace="Frontier/Runtime",
                MetricName=metric,
                Dimensions=[{"Name": "Stack", "Value": settings.stack}],
                StartTime=now - timedelta(minutes=10),
                EndTime=now + timedelta(minutes=2),
                Period=60,
                Statistics=["Maximum"],
            )["Datapoints"]
        ]

    deadline = time.monotonic() + 90  # the probe runs once a minute
    while 1.0 not in figures("ProbeSuccess") and time.monotonic() < deadline:
        time.sleep(1)
    assert 1.0 in figures("ProbeSuccess")
    assert all(0 < latency < 20_000 for latency in figures("ProbeLatency"))
