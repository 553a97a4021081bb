"""Boot records: what each host's bootstrap did at launch (continued, empty or abandoned, and why).

Hosts write them under ``boots/`` of the stack's history prefix (frontier_hostside/bootstrap.py); they
may write nowhere else there. ``fab history`` lists the latest beside the deploy records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from frontier_hostside.names import BOOT_RECORDS_PREFIX

from frontier.release.history import HistoryStore


@dataclass(frozen=True)
class BootRecord:
    at: str
    host: str
    node_group: str
    release: str
    outcome: str  # continued | empty | abandoned
    reason: str


def boot_records(store: HistoryStore, limit: int = 20) -> list[BootRecord]:
    """The newest ``limit`` boot records, oldest first (keys start with the boot's UTC time)."""
    prefix = store.prefix + BOOT_RECORDS_PREFIX
    keys: list[str] = []
    for page in store.s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    records = []
    for key in sorted(keys)[-limit:]:
        data = json.loads(store.s3.get_object(Bucket=store.bucket, Key=key)["Body"].read())
        records.append(
            BootRecord(
                at=str(data.get("at", "")),
                host=str(data.get("host", "")),
                node_group=str(data.get("node_group", "")),
                release=str(data.get("release", "")),
                outcome=str(data.get("outcome", "")),
                reason=str(data.get("reason", "")),
            )
        )
    return records
