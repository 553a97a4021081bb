"""Interruption notices waiting on the stack's queue: what ``fab status`` shows under its table.

EventBridge puts EC2's Spot Instance Interruption Warnings, Instance Rebalance Recommendations and
Capacity Block expiration warnings on ``frontier-<stack>-interruptions`` (infra/interruptions.py).
This reads them without consuming them — each receive uses a visibility timeout of 0, so the
messages stay for whoever acts on them (the Node Termination Handler on EKS) — through boto3, so
moto stands in for SQS in the tests. A stack that buys on-demand only has no queue and no notices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from frontier.config.purchase import notice_queue_name

# Receives of up to 10 messages each; with a visibility timeout of 0 a receive may repeat messages,
# so the reader stops once a round brings nothing new.
MAX_ROUNDS = 10
KINDS = {
    "EC2 Spot Instance Interruption Warning": "spot interruption",
    "EC2 Instance Rebalance Recommendation": "rebalance recommendation",
    "Capacity Block Reservation Expiration Warning": "capacity block ending",
}


@dataclass(frozen=True)
class PendingNotice:
    kind: str  # spot interruption, rebalance recommendation, capacity block ending (or the detail type)
    at: str  # when EC2 sent it (the event's time, UTC)
    subject: str  # the instance id, or the capacity reservation id of a block
    action: str  # a spot notice's instance-action (terminate, stop, hibernate); "" otherwise

    def row(self) -> tuple[str, str, str, str]:
        return (self.at.replace("T", " ").rstrip("Z"), self.kind, self.subject, self.action or "-")


def parse_notice(body: str) -> PendingNotice | None:
    """One EventBridge event as the queue holds it; None for a body that is not one."""
    try:
        event = json.loads(body)
    except ValueError:
        return None
    if not isinstance(event, dict) or "detail-type" not in event:
        return None
    detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
    detail_type = str(event["detail-type"])
    subject = str(
        detail.get("instance-id")
        or detail.get("capacity-reservation-id")
        or ",".join(event.get("resources", []))
    )
    return PendingNotice(
        kind=KINDS.get(detail_type, detail_type),
        at=str(event.get("time", "")),
        subject=subject,
        action=str(detail.get("instance-action", "")),
    )


def pending_notices(sqs: Any, stack: str) -> list[PendingNotice] | None:
    """The notices on the stack's queue, oldest first; None where the stack has no queue."""
    try:
        url = sqs.get_queue_url(QueueName=notice_queue_name(stack))["QueueUrl"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in (
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
        ):
            return None
        raise
    seen: dict[str, PendingNotice] = {}
    for _ in range(MAX_ROUNDS):
        messages = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=0
        ).get("Messages", [])
        fresh = [m for m in messages if m["MessageId"] not in seen]
        if not fresh:
            break
        for message in fresh:
            notice = parse_notice(message.get("Body", ""))
            if notice is not None:
                seen[message["MessageId"]] = notice
    return sorted(seen.values(), key=lambda n: n.at)
