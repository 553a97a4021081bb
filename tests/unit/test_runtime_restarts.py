"""``runtime-restarts``: a runtime its supervisor keeps restarting. A crash loop never reads as
``runtime-down`` on the cloud targets (each start is younger than a start may take), so this alarm is
what sees it, on every target: the local evaluator's watch over each slot's supervisor, the
Kubernetes rule over the kubelet's count, and every rule a stack renders parsed by PromQL's grammar."""

from __future__ import annotations

import json

import promql_parser
import pytest
import yaml
from frontier_hostside.names import CONTAINER_NAME, SUPERVISOR_STATE_NAME

from frontier.alarms import HOSTS, NAMED_ALARMS, RESTARTS_ALLOWED, RESTARTS_WINDOW_S
from frontier.config.load import available_stacks
from frontier.hosts.inventory import HostSpec
from frontier.render.alerts import render_alerts, render_resource_alerts
from frontier.targets import load_stack
from frontier.targets.local.alarms import RestartsWatch, supervisor_restarts

SHIPPED_STACKS = available_stacks()


def test_one_restart_is_a_host_healing_itself_and_never_fires():
    watch = RestartsWatch("warn")
    assert watch.observe("host-1", 0, now=0.0) is None
    assert watch.observe("host-1", 1, now=30.0) is None
    assert watch.observe("host-1", 1, now=300.0) is None


def test_a_second_restart_within_the_window_fires_once_and_clears_once_the_window_passes():
    watch = RestartsWatch("warn")
    watch.observe("host-1", 0, now=0.0)
    watch.observe("host-1", 1, now=10.0)
    fired = watch.observe("host-1", 2, now=40.0)
    assert (fired.alarm, fired.old, fired.new, fired.severity) == ("runtime-restarts", "OK", "ALARM", "warn")
    assert "2 times in 10 minutes" in fired.reason
    assert watch.observe("host-1", 2, now=100.0) is None  # once, not every round
    cleared = watch.observe("host-1", 2, now=40.0 + RESTARTS_WINDOW_S)
    assert (cleared.old, cleared.new) == ("ALARM", "OK")


def test_a_long_back_off_still_fires_two_restarts_nine_minutes_apart():
    watch = RestartsWatch("warn")
    watch.observe("host-1", 4, now=0.0)
    watch.observe("host-1", 5, now=60.0)
    assert watch.observe("host-1", 6, now=60.0 + 540.0).new == "ALARM"


def test_a_new_supervisor_counting_from_zero_is_not_read_as_restarts():
    watch = RestartsWatch("warn")
    watch.observe("host-1", 7, now=0.0)
    assert watch.observe("host-1", 0, now=30.0) is None
    assert watch.observe("host-1", 1, now=60.0) is None


def test_each_slot_is_watched_on_its_own():
    watch = RestartsWatch("warn")
    for host in ("host-1", "host-2"):
        watch.observe(host, 0, now=0.0)
    watch.observe("host-1", 1, now=10.0)
    assert watch.observe("host-2", 1, now=20.0) is None
    assert watch.observe("host-1", 2, now=30.0).host == "host-1"


def test_the_slots_count_is_read_from_its_supervisors_state_file(tmp_path):
    host = HostSpec("host-1", "127.0.2.2", 22, str(tmp_path), "gpu")
    assert supervisor_restarts(host) == 0  # no supervisor yet
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / SUPERVISOR_STATE_NAME).write_text(json.dumps({"pid": 7, "restarts": 3}))
    assert supervisor_restarts(host) == 3


def test_the_rule_counts_the_kubelets_restarts_of_the_runtime_container_where_kube_state_metrics_runs():
    rule = NAMED_ALARMS["runtime-restarts"].prometheus(load_stack("eks-prod"), HOSTS)
    expr = promql_parser.parse(rule.expr)
    assert isinstance(expr, promql_parser.BinaryExpr)
    kube_state, scraped = rule.expr.split(" or ")
    assert f'kube_pod_container_status_restarts_total{{container="{CONTAINER_NAME}"}}' in kube_state
    assert f"[{RESTARTS_WINDOW_S // 60}m]" in kube_state and kube_state.endswith(f"> {RESTARTS_ALLOWED})")
    # A pod's scraped process starts are left to the kubelet's count: one alert per crash loop, not two.
    assert (
        scraped.startswith("(changes(process_start_time_seconds{")
        and "unless on(namespace, pod) kube_pod_info" in scraped
    )


def test_every_target_renders_the_same_rule():
    rules = {
        stack: NAMED_ALARMS["runtime-restarts"].prometheus(load_stack(stack), HOSTS).expr
        for stack in ("prod", "eks-prod", "local")
    }
    assert len(set(rules.values())) == 1, rules


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_prometheus_rule_a_stack_renders_parses(stack):
    settings = load_stack(stack)
    files = [render_alerts(settings), render_resource_alerts(settings)]
    rules = [rule for text in files for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]
    assert len(rules) >= len(NAMED_ALARMS)
    for rule in rules:
        try:
            promql_parser.parse(rule["expr"])
        except ValueError as exc:
            pytest.fail(f"{stack}: {rule['alert']}: {exc}: {rule['expr']}")
