"""The stack's ``alerts:`` section: routes per severity, severities per alarm, and what is refused.

Each refusal loads a copy of a real stack file with one change and names the field, the value and
what is allowed, before anything is built.
"""

from __future__ import annotations

import pytest

from frontier.config.schema import ALARM_SEVERITIES, SEVERITIES
from frontier.errors import StackError
from frontier.render.alerts import severities
from frontier.targets import load_stack

PAGE_QUEUE = "arn:aws:sqs:us-east-1:123456789012:oncall"


def load(changed_stack, stack: str, changes: dict, delete: tuple[str, ...] = ()):
    path = changed_stack(stack, changes, delete)
    return load_stack(stack, path=path)


def test_every_alarm_has_a_default_severity_of_the_three():
    assert set(ALARM_SEVERITIES.values()) <= set(SEVERITIES) == {"page", "warn", "info"}
    assert ALARM_SEVERITIES["runtime-down"] == "page"  # fewer runtimes ready than desired


def test_the_stack_overrides_an_alarms_severity_and_the_rest_keep_the_table(changed_stack):
    settings = load(changed_stack, "staging", {"alerts": {"severities": {"queue-depth": "page"}}})
    table = severities(settings)
    assert table["queue-depth"] == "page"
    assert {k: v for k, v in table.items() if k != "queue-depth"} == {
        k: v for k, v in ALARM_SEVERITIES.items() if k != "queue-depth"
    }


def test_an_unknown_severity_is_refused_naming_the_alarm_and_the_three_severities(changed_stack):
    with pytest.raises(StackError) as err:
        load(changed_stack, "staging", {"alerts": {"severities": {"gpu-memory": "critical"}}})
    message = str(err.value)
    assert "alerts.severities.gpu-memory = 'critical'" in message
    assert "'page', 'warn' or 'info'" in message


def test_an_unknown_alarm_name_is_refused_naming_it_and_the_known_alarms(changed_stack):
    with pytest.raises(StackError) as err:
        load(changed_stack, "staging", {"alerts": {"severities": {"gpu-melting": "page"}}})
    message = str(err.value)
    assert "alerts.severities.gpu-melting = 'page': no such alarm" in message
    assert "runtime-down" in message and "gpu-memory" in message


def test_an_unknown_route_is_refused_naming_it(changed_stack):
    with pytest.raises(StackError, match=r"alerts\.routes\.critical.*Extra inputs are not permitted"):
        load(changed_stack, "staging", {"alerts": {"routes": {"critical": {"emails": ["a@b.example"]}}}})


@pytest.mark.parametrize(
    ("field", "value", "shape"),
    [
        ("emails", "not-an-address", "an e-mail address"),
        ("sqs_queue_arns", "arn:aws:sns:us-east-1:123456789012:a-topic", "an SQS queue ARN"),
        ("https_endpoints", "http://hooks.example/plain-http", "an https:// URL"),
    ],
)
def test_a_malformed_endpoint_is_refused_naming_the_route_and_the_field(changed_stack, field, value, shape):
    with pytest.raises(StackError) as err:
        load(changed_stack, "staging", {"alerts": {"routes": {"warn": {field: [value]}}}})
    assert f"alerts.routes.warn.{field}[0] = {value!r}: Value error, must be {shape}" in str(err.value)


def test_a_production_stack_with_an_empty_page_route_is_refused(changed_stack):
    with pytest.raises(StackError) as err:
        load(changed_stack, "prod", {"alerts": {"routes": {"warn": {"emails": ["team@frontier.example"]}}}})
    message = str(err.value)
    assert "alerts.routes.page: stack 'prod' is a production stack" in message
    assert "emails, sqs_queue_arns or https_endpoints" in message


def test_every_stack_named_prod_is_a_production_stack(changed_stack):
    with pytest.raises(StackError, match=r"alerts\.routes\.page: stack 'eks-prod' is a production stack"):
        load(changed_stack, "eks-prod", {"alerts": {}})


def test_a_page_route_of_one_queue_is_enough_for_production(changed_stack):
    settings = load(changed_stack, "prod", {"alerts": {"routes": {"page": {"sqs_queue_arns": [PAGE_QUEUE]}}}})
    assert settings.alert_route("page").sqs_queue_arns == (PAGE_QUEUE,)


def test_a_development_stack_may_page_nobody(changed_stack):
    settings = load(changed_stack, "dev", {"monitoring.alarm_email": ""})
    assert settings.alert_route("page").empty


def test_the_monitoring_alarm_email_joins_the_page_route_once(changed_stack):
    settings = load(
        changed_stack,
        "staging",
        {
            "alerts": {
                "routes": {"page": {"emails": ["staging-alerts@frontier.example", "lead@frontier.example"]}}
            }
        },
    )
    page = settings.alert_route("page")
    assert page.emails == ("staging-alerts@frontier.example", "lead@frontier.example")
    assert settings.alert_route("warn").empty


def test_the_local_evaluators_periods_are_bounded(changed_stack):
    with pytest.raises(
        StackError, match=r"alerts\.evaluation_interval_s = 0: Input should be greater than 0"
    ):
        load(changed_stack, "local", {"alerts": {"evaluation_interval_s": 0}})
