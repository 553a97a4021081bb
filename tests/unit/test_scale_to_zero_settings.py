"""Scale to zero in a stack file: ``min_size: 0`` only with the gateway's hold queue for the pool and
an idle time; a hold that outlasts the balancer's idle timeout or a launch's readiness budget is
refused — each at load time, naming the field, the value and what is allowed. Then what those
settings drive: the KEDA ScaledObject on Kubernetes and the local autoscaler's decisions."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest
from frontier_gateway.config import ConfigError, parse_config
from frontier_gateway.hold import HELD_REQUESTS_CW_METRIC, POOL_WAITING_METRIC
from frontier_hostside.names import CLOUDWATCH_NAMESPACE

from frontier import project
from frontier.config.schema import LocalAutoscaler, Settings
from frontier.demo.zero import IDLE_TO_ZERO_S, zero_settings
from frontier.errors import StackError
from frontier.targets import load_stack
from frontier.targets.kubernetes.autoscaling import scaled_object
from frontier.targets.local.autoscaler import Decider, Observation, Policy
from tests.infra.infra_mocks import Graph, run_program
from tests.unit.conftest import edit_stack_file

MODEL = "tiny-llama"  # the local stack's model
TENANT = {
    "name": "acme",
    "api_key_secret": "frontier/local/tenants/acme",
    "models": [MODEL],
    "requests_per_minute": 600,
    "tokens_per_minute": 200_000,
    "max_concurrent_requests": 16,
    "priority": "interactive",
}


def _gateway(hold: dict | None = None) -> dict:
    return {"metering": {"uri": "/tmp/metering.jsonl"}, "hold": hold or {}}


def _at_zero(changed_stack, *, hold: dict | None, idle: float | None = 30, **more):
    changes = {
        "node_groups[0].min_size": 0,
        "node_groups[0].desired_size": 0,
        "gateway": _gateway(hold),
        "tenants": [TENANT],
        **more,
    }
    if idle is not None:
        changes["node_groups[0].idle_to_zero_s"] = idle
    return changed_stack("local", changes)


def _refusal(path) -> str:
    with pytest.raises(StackError) as err:
        load_stack("local", path=path)
    return str(err.value)


def test_a_pool_at_min_size_zero_with_a_hold_queue_and_an_idle_time_loads(changed_stack) -> None:
    path = _at_zero(changed_stack, hold={MODEL: {"max_requests": 32, "timeout_s": 45}})
    settings = load_stack("local", path=path)
    assert settings.serving_group.min_size == 0
    assert settings.serving_group.idle_to_zero_s == 30
    assert settings.gateway is not None
    assert settings.gateway.hold[MODEL].max_requests == 32


def test_min_size_zero_without_a_hold_queue_is_refused_naming_the_field(changed_stack) -> None:
    message = _refusal(_at_zero(changed_stack, hold=None))
    assert "node_groups[0].min_size = 0" in message
    assert f"add gateway.hold.{MODEL}" in message


def test_min_size_zero_without_a_gateway_is_refused_naming_the_field(changed_stack) -> None:
    path = changed_stack(
        "local",
        {"node_groups[0].min_size": 0, "node_groups[0].desired_size": 0, "node_groups[0].idle_to_zero_s": 30},
    )
    assert "node_groups[0].min_size = 0: may be 0 only with a hold queue" in _refusal(path)


def test_min_size_zero_without_an_idle_time_is_refused(changed_stack) -> None:
    message = _refusal(_at_zero(changed_stack, hold={MODEL: {"max_requests": 8, "timeout_s": 30}}, idle=None))
    assert "node_groups[0].idle_to_zero_s: must be set with min_size 0" in message


def test_an_idle_time_on_a_group_that_cannot_reach_zero_is_refused(changed_stack) -> None:
    path = changed_stack("local", {"node_groups[0].idle_to_zero_s": 30})
    assert "node_groups[0].idle_to_zero_s = 30.0: has no effect with min_size 2" in _refusal(path)


def test_a_hold_longer_than_the_balancers_idle_timeout_is_refused(changed_stack) -> None:
    # The local stack's edge.idle_timeout_s is 60: a held request sends nothing, so it would be cut.
    message = _refusal(_at_zero(changed_stack, hold={MODEL: {"max_requests": 8, "timeout_s": 60}}))
    assert f"gateway.hold.{MODEL}.timeout_s = 60.0: must be < edge.idle_timeout_s (60 s)" in message


def test_a_hold_longer_than_a_launchs_readiness_budget_is_refused(changed_stack) -> None:
    path = _at_zero(
        changed_stack,
        hold={MODEL: {"max_requests": 8, "timeout_s": 50}},
        **{"rollout.readiness_timeout_s": 40},
    )
    assert (
        f"gateway.hold.{MODEL}.timeout_s = 50.0: must be <= rollout.readiness_timeout_s (40 s)"
        in _refusal(path)
    )


def test_a_hold_for_a_model_the_stack_does_not_serve_is_refused(changed_stack) -> None:
    path = changed_stack(
        "local", {"gateway": _gateway({"other": {"max_requests": 8, "timeout_s": 30}}), "tenants": [TENANT]}
    )
    assert "gateway.hold.other = 'other': must name a served model (tiny-llama)" in _refusal(path)


@pytest.mark.parametrize(
    ("hold", "allowed"),
    [
        (
            {"max_requests": 0, "timeout_s": 30},
            "max_requests = 0: Input should be greater than or equal to 1",
        ),
        ({"max_requests": 8, "timeout_s": 0}, "timeout_s = 0: Input should be greater than 0"),
    ],
    ids=["max_requests=0", "timeout_s=0"],
)
def test_a_hold_queue_out_of_range_is_refused_naming_field_value_and_range(
    changed_stack, hold, allowed
) -> None:
    assert f"gateway.hold.{MODEL}.{allowed}" in _refusal(_at_zero(changed_stack, hold={MODEL: hold}))


def test_the_gateways_own_file_refuses_a_hold_for_a_model_it_has_no_pool_for() -> None:
    text = """
models: [{name: m, replicas: ["http://127.0.0.1:9"]}]
tenants: [{name: a, key_sha256: ["%s"], models: [m], requests_per_minute: 1, tokens_per_minute: 1,
           max_concurrent_requests: 1, priority: interactive}]
metering: {uri: /tmp/m.jsonl}
hold: {other: {max_requests: 4, timeout_s: 10}}
""" % ("0" * 64)
    with pytest.raises(ConfigError, match=r"hold names models \['other'\] that no pool serves \(\['m'\]\)"):
        parse_config(text)


# --- what the settings render: KEDA on Kubernetes -------------------------------------------------

KEDA_SCHEMA = project.root() / "tests" / "kubernetes" / "schemas" / "keda-2.16-scaledobject.json"


def _eks_at_zero() -> Settings:
    """eks-prod with its serving group allowed to reach zero. Built in memory: a kubernetes stack
    cannot have a gateway section yet (its target's rule refuses one), so no stack file with the
    hold queue that min_size 0 needs would load; the ScaledObject is rendered from the settings alone."""
    settings = load_stack("eks-prod")
    (pool,) = settings.pools
    group = pool.group.model_copy(update={"min_size": 0, "idle_to_zero_s": 600})
    return settings.with_pool(pool.model_copy(update={"group": group}))


def test_a_kubernetes_pool_that_may_reach_zero_renders_a_scaledobject_with_min_zero_and_the_idle_time() -> (
    None
):
    settings = _eks_at_zero()
    manifest = scaled_object(settings, settings.only_pool).to_dict()
    jsonschema.validate(manifest, json.loads(KEDA_SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    assert manifest["spec"]["minReplicaCount"] == 0
    assert manifest["spec"]["cooldownPeriod"] == 600


def test_held_requests_in_the_gateway_activate_a_kubernetes_pool_at_zero() -> None:
    settings = _eks_at_zero()
    [held] = [
        t
        for t in scaled_object(settings, settings.only_pool).to_dict()["spec"]["triggers"]
        if t["name"] == "held-by-gateway"
    ]
    assert held["type"] == "prometheus"
    assert held["metadata"]["query"] == (
        f'sum({POOL_WAITING_METRIC}{{namespace="{settings.kubernetes.namespace}",pool="{settings.model.name}"}})'
    )
    assert held["metadata"]["activationThreshold"] == "0"


def test_a_kubernetes_pool_with_min_size_above_zero_keeps_its_floor_and_no_demand_trigger() -> None:
    settings = load_stack("eks-prod")
    spec = scaled_object(settings, settings.only_pool).to_dict()["spec"]
    assert spec["minReplicaCount"] == settings.kubernetes.autoscaling.min_replicas
    assert "held-by-gateway" not in [t["name"] for t in spec["triggers"]]


# --- what the settings drive: the local autoscaler's decisions ------------------------------------

TIMING = LocalAutoscaler(interval_s=1, scale_out_after_s=5, scale_in_after_s=10, cooldown_s=3)


def _decider(idle_to_zero_s: float | None = 5, min_size: int = 0) -> Decider:
    return Decider(
        Policy(
            target_queue_depth=4,
            min_size=min_size,
            max_size=2,
            max_concurrency=8,
            scale_in_utilisation=0.5,
            timing=TIMING,
            idle_to_zero_s=idle_to_zero_s,
        )
    )


def _seen(at: float, hosts: int, *, held: float = 0, answered: float = 0, running: float = 0) -> Observation:
    return Observation(at, hosts, waiting=0, running=running, held=held, answered=answered)


def test_a_pool_at_zero_with_held_requests_launches_one_host_at_once_even_in_the_cooldown() -> None:
    decider = _decider()
    decider.changed(0.0)  # it just went to zero: the cooldown runs until 3 s
    decision = decider.feed(_seen(0.5, 0, held=3))
    assert decision is not None and (decision.current, decision.desired) == (0, 1)
    assert "3 request(s) held by the gateway for a pool at zero" in decision.reason


def test_a_pool_at_zero_with_nothing_held_stays_at_zero() -> None:
    assert _decider().feed(_seen(0.0, 0)) is None


def test_a_pool_idle_for_idle_to_zero_s_goes_to_zero() -> None:
    decider = _decider(idle_to_zero_s=5)
    # The first scrape is the gateway count's baseline: idle from 1 s, zero at 6 s.
    decisions = [decider.feed(_seen(float(t), 1, answered=7)) for t in range(0, 7)]
    assert decisions[:6] == [None] * 6
    assert decisions[6] is not None and (decisions[6].current, decisions[6].desired) == (1, 0)
    assert "idle_to_zero_s 5" in decisions[6].reason


def test_a_request_answered_between_two_scrapes_restarts_the_idle_time() -> None:
    decider = _decider(idle_to_zero_s=5)
    # Nothing runs at any scrape, but the gateway's answered count moves at 3 s: not idle.
    answered = [7, 7, 7, 8, 8, 8, 8, 8, 8]
    decisions = [decider.feed(_seen(float(t), 1, answered=a)) for t, a in enumerate(answered)]
    assert decisions == [None] * 9  # idle again from 4 s: zero is due at 9 s, not before


def test_a_group_with_a_floor_above_zero_never_goes_to_zero() -> None:
    decider = _decider(idle_to_zero_s=None, min_size=1)
    assert [decider.feed(_seen(float(t), 1)) for t in range(0, 60)] == [None] * 60


# --- what the settings render: the EC2 group's alarms (Pulumi mocks: no AWS API here) ---------------


@pytest.fixture(scope="module")
def prod_at_zero(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    """prod's program under mocks, its serving group allowed to reach zero (one run for the module)."""

    model = load_stack("prod").model.name
    path = tmp_path_factory.mktemp("stacks") / "Pulumi.prod.yaml"
    shutil.copy(project.stacks_dir() / "Pulumi.prod.yaml", path)
    edit_stack_file(
        path,
        {
            "node_groups[0].min_size": 0,
            "node_groups[0].idle_to_zero_s": 900,
            "gateway": {
                **_gateway({model: {"max_requests": 64, "timeout_s": 120}}),
                "metering": {"uri": "s3://frontier-prod-metering-123456789012-us-east-1/usage"},
                "ami_id": "ami-0123456789abcdef0",
            },
            "tenants": [{**TENANT, "models": [model], "api_key_secret": "frontier/prod/tenants/acme"}],
        },
    )
    return run_program(load_stack("prod", path=path))


def test_an_ec2_group_at_zero_is_launched_by_an_alarm_on_requests_the_gateway_holds(prod_at_zero) -> None:
    graph, settings = prod_at_zero, prod_at_zero.settings
    groups = [r for r in graph.resources if r.type == "aws:autoscaling/group:Group"]
    # The serving group only: the gateway's own group keeps its floor.
    assert [r.inputs["minSize"] for r in groups].count(0) == 1
    policies = {r.name: r.inputs for r in graph.resources if r.type == "aws:autoscaling/policy:Policy"}
    alarms = {r.name: r.inputs for r in graph.resources if r.type == "aws:cloudwatch/metricAlarm:MetricAlarm"}
    [launch] = [name for name in policies if name.endswith("-zero-launch")]
    assert policies[launch]["adjustmentType"] == "ExactCapacity"
    assert policies[launch]["stepAdjustments"][0]["scalingAdjustment"] == 1
    queries = {q["id"]: q for q in alarms[launch]["metricQueries"]}
    held = queries["held"]["metric"]
    assert (held["namespace"], held["metricName"]) == (CLOUDWATCH_NAMESPACE, HELD_REQUESTS_CW_METRIC)
    assert held["dimensions"] == {"Stack": "prod", "NodeGroup": settings.serving_group.name}
    assert queries["signal"]["expression"] == "IF(FILL(held, 0) > 0 AND FILL(serving, 0) == 0, 1, 0)"


def test_an_idle_ec2_group_goes_to_zero_after_idle_to_zero_s(prod_at_zero) -> None:
    graph = prod_at_zero
    policies = {r.name: r.inputs for r in graph.resources if r.type == "aws:autoscaling/policy:Policy"}
    alarms = {r.name: r.inputs for r in graph.resources if r.type == "aws:cloudwatch/metricAlarm:MetricAlarm"}
    [idle] = [name for name in policies if name.endswith("-zero-idle")]
    assert policies[idle]["stepAdjustments"][0]["scalingAdjustment"] == 0
    assert alarms[idle]["evaluationPeriods"] == 15  # 900 s of one-minute periods
    assert alarms[idle]["datapointsToAlarm"] == 15


def test_the_demos_zero_variant_of_a_stack_with_a_gateway_passes_every_rule(changed_stack) -> None:
    path = changed_stack("local", {"gateway": _gateway(), "tenants": [TENANT]})
    zeroed = zero_settings(load_stack("local", path=path))
    assert zeroed.serving_group.min_size == 0
    assert zeroed.serving_group.idle_to_zero_s == IDLE_TO_ZERO_S
    assert zeroed.gateway is not None
    hold = zeroed.gateway.hold[MODEL]
    assert hold.timeout_s == zeroed.rollout.readiness_timeout_s < zeroed.edge.idle_timeout_s
