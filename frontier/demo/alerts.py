"""The demo's alert check: after a runtime is killed, the page arrives and the recovery clears it.

The local stack's alarm evaluator (:mod:`frontier.targets.local.alarms`) publishes ``runtime-down``
to the page topic in moto's SNS, and the stack's page route subscribes an SQS queue to it. This
module reads that queue as an on-call tool would and prints each message with its time after the
kill: the ALARM naming the host, then the OK once the supervisor's restart answers again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.targets.local import cluster


@dataclass(frozen=True)
class AlarmMessage:
    """One message of the page queue: an alarm of one host slot entering ALARM or OK."""

    alarm: str
    state: str
    old_state: str
    host: str
    severity: str
    reason: str
    changed_at: float  # when the alarm changed state (seconds since the epoch)
    arrived_at: float  # when the queue received it (SQS's SentTimestamp)

    @classmethod
    def from_sqs(cls, message: dict) -> AlarmMessage:
        # SNS wraps the alarm's JSON in its own envelope ("Message") on its way to SQS.
        alarm = json.loads(json.loads(message["Body"])["Message"])
        return cls(
            alarm=alarm["AlarmName"],
            state=alarm["NewStateValue"],
            old_state=alarm["OldStateValue"],
            host=alarm["Host"],
            severity=alarm["Severity"],
            reason=alarm["NewStateReason"],
            changed_at=datetime.fromisoformat(alarm["StateChangeTime"]).timestamp(),
            arrived_at=int(message["Attributes"]["SentTimestamp"]) / 1000,
        )


def page_queue_url(settings: Settings, timeout_s: float = 10.0) -> str:
    """The URL of the first SQS queue the stack's page route names (made by the evaluator at start)."""
    route = settings.alert_route("page")
    if not route.sqs_queue_arns:
        raise FrontierError(
            f"{settings.source}: alerts.routes.page.sqs_queue_arns is empty: no queue to read the pages from"
        )
    sqs = cluster.aws_client(settings, "sqs", actor="admin")
    name = route.sqs_queue_arns[0].rsplit(":", 1)[1]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return sqs.get_queue_url(QueueName=name)["QueueUrl"]
        except sqs.exceptions.QueueDoesNotExist:
            if time.monotonic() > deadline:
                raise FrontierError(
                    f"queue {name} does not exist after {timeout_s:g} s: is the alarm evaluator running "
                    f"(`fab local.up`; its log is {cluster.state_dir(settings) / 'alarms.log'})?"
                ) from None
            time.sleep(0.2)


def receive(
    settings: Settings, until: Callable[[list[AlarmMessage]], bool], timeout_s: float
) -> list[AlarmMessage]:
    """Messages of the page queue (deleted as read) until ``until(messages)`` holds or ``timeout_s``."""
    sqs = cluster.aws_client(settings, "sqs", actor="admin")
    url = page_queue_url(settings)
    found: list[AlarmMessage] = []
    deadline = time.monotonic() + timeout_s
    while not until(found) and time.monotonic() < deadline:
        reply = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["SentTimestamp"]
        )
        for message in reply.get("Messages", []):
            found.append(AlarmMessage.from_sqs(message))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return sorted(found, key=lambda m: m.changed_at)


def recovered(host: str, since: float = 0.0) -> Callable[[list[AlarmMessage]], bool]:
    """``until`` for :func:`receive`: the host's alarm has fired and cleared (after ``since``)."""

    def done(messages: list[AlarmMessage]) -> bool:
        states = [m.state for m in messages if m.host == host and m.changed_at >= since]
        return "ALARM" in states and "OK" in states[states.index("ALARM") :]

    return done


def print_page_messages(
    settings: Settings,
    host: str,
    killed_at: float,
    say: Callable[[str], None] = print,
    timeout_s: float = 30.0,
) -> list[AlarmMessage]:
    """Read the page queue until ``host``'s alarm has fired and cleared after ``killed_at`` (seconds
    since the epoch); print each message raised since then with its times after the kill, and
    return those."""
    messages = receive(settings, recovered(host, killed_at), timeout_s)
    since = [m for m in messages if m.changed_at >= killed_at]
    if len(since) < len(messages):
        say(f"  page queue: {len(messages) - len(since)} earlier messages (before the kill) skipped")
    if not recovered(host, killed_at)(since):
        say(f"  page queue: no ALARM then OK for {host} within {timeout_s:g} s")
    for m in since:
        say(
            f"  page queue: {m.state:<5} {m.alarm} on {m.host}: raised +{m.changed_at - killed_at:.1f}s, "
            f"on the queue +{m.arrived_at - killed_at:.1f}s after the kill ({m.reason})"
        )
    return since
