"""``fab status``'s interruption notices: EC2's events routed by the stack's EventBridge pattern to
its queue (moto's EventBridge and SQS, in-process), read without being consumed."""

from __future__ import annotations

import io
import json

import boto3
import pytest
from moto import mock_aws
from rich.console import Console

from frontier.cli.ops import _print_notices
from frontier.config.purchase import SpotCapacity, notice_queue_name
from frontier.config.schema import Settings
from frontier.hosts.notices import pending_notices
from frontier.targets import load_stack
from infra.interruptions import CAPACITY_BLOCK_WARNING, REBALANCE_RECOMMENDATION, SPOT_WARNING, notice_pattern

REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION), boto3.client("events", region_name=REGION)


def buying_spot(settings: Settings) -> Settings:
    """``settings`` with its first node group buying spot above an on-demand host: a stack with a queue."""
    first, *rest = settings.node_groups
    spot = first.model_copy(update={"capacity": SpotCapacity(market="spot", on_demand_base=1)})
    return settings.model_copy(update={"node_groups": (spot, *rest)})


def wire(sqs, events, stack: str = "prod") -> str:
    """The queue and rule infra/interruptions.py declares, made through the API."""
    url = sqs.create_queue(QueueName=notice_queue_name(stack))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name=notice_queue_name(stack), EventPattern=json.dumps(notice_pattern()))
    events.put_targets(Rule=notice_queue_name(stack), Targets=[{"Id": "queue", "Arn": arn}])
    return url


def send(events, detail_type: str, detail: dict, source: str = "aws.ec2") -> None:
    entry = {"Source": source, "DetailType": detail_type, "Detail": json.dumps(detail)}
    assert events.put_events(Entries=[entry])["FailedEntryCount"] == 0


def test_spot_rebalance_and_block_warnings_reach_the_queue_and_are_listed(aws):
    sqs, events = aws
    wire(sqs, events)
    send(events, SPOT_WARNING, {"instance-id": "i-0aaa", "instance-action": "terminate"})
    send(events, REBALANCE_RECOMMENDATION, {"instance-id": "i-0bbb"})
    send(events, CAPACITY_BLOCK_WARNING, {"capacity-reservation-id": "cr-0123456789abcdef0"})
    notices = pending_notices(sqs, "prod")
    assert notices is not None
    assert sorted((n.kind, n.subject, n.action) for n in notices) == [
        ("capacity block ending", "cr-0123456789abcdef0", ""),
        ("rebalance recommendation", "i-0bbb", ""),
        ("spot interruption", "i-0aaa", "terminate"),
    ]


def test_other_events_do_not_reach_the_queue(aws):
    sqs, events = aws
    wire(sqs, events)
    send(events, "EC2 Instance State-change Notification", {"instance-id": "i-0ccc", "state": "running"})
    send(events, SPOT_WARNING, {"instance-id": "i-0ddd"}, source="custom.app")
    assert pending_notices(sqs, "prod") == []


def test_reading_the_notices_leaves_them_on_the_queue(aws):
    sqs, events = aws
    url = wire(sqs, events)
    send(events, SPOT_WARNING, {"instance-id": "i-0aaa", "instance-action": "terminate"})
    assert len(pending_notices(sqs, "prod") or []) == 1
    assert len(pending_notices(sqs, "prod") or []) == 1
    left = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(left) == 1


def test_a_stack_without_a_queue_has_no_notices_and_status_says_nothing_of_them(aws):
    sqs, _ = aws
    assert pending_notices(sqs, "dev") is None
    out = io.StringIO()

    class Backend:
        def aws_client(self, service: str):
            raise AssertionError(
                f"a stack that buys on-demand only asked for {service}: it has no queue to read"
            )

    dev = load_stack("dev")
    assert all(group.capacity is None for group in dev.node_groups)
    _print_notices(Console(file=out, width=160), Backend(), dev)
    assert out.getvalue() == ""


def test_status_prints_each_waiting_notice_as_a_row(aws):
    sqs, events = aws
    wire(sqs, events)
    send(events, SPOT_WARNING, {"instance-id": "i-0aaa", "instance-action": "terminate"})
    out = io.StringIO()

    class Backend:
        def aws_client(self, service: str):
            return boto3.client(service, region_name=REGION)

    _print_notices(Console(file=out, width=160), Backend(), buying_spot(load_stack("prod")))
    text = out.getvalue()
    assert "interruption notices waiting" in text and "spot interruption" in text
    assert "i-0aaa" in text and "terminate" in text
