"""The hosts of an EC2 node group, found by their tags.

Running instances tagged ``frontier:stack=<stack>`` and ``frontier:node-group=<group>`` (the tags
the Pulumi program puts on every node), found with boto3.
"""

from __future__ import annotations

from typing import Any

from frontier_hostside.names import NODE_GROUP_TAG as GROUP_TAG
from frontier_hostside.names import STACK_TAG

from frontier.config.schema import Settings
from frontier.hosts.inventory import HostSpec, InventoryError

# The interpreter of an EC2 host: it runs the host agent.
HOST_PYTHON = "/usr/bin/python3"


def discover(settings: Settings, ec2: Any, group: str, *, root: str, python: str) -> list[HostSpec]:
    """Running instances tagged with the stack and node group, in a stable order."""
    filters = [
        {"Name": f"tag:{STACK_TAG}", "Values": [settings.stack]},
        {"Name": f"tag:{GROUP_TAG}", "Values": [group]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    found = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                address = inst.get("PrivateIpAddress")
                if not address:
                    continue
                name = tags.get("Name") or inst["InstanceId"]
                found.append(
                    HostSpec(
                        f"{name}-{inst['InstanceId'][-6:]}",
                        address,
                        22,
                        root,
                        group,
                        inst["InstanceId"],
                        python=python,
                    )
                )
    if not found:
        raise InventoryError(
            f"stack {settings.stack!r}: no running instances tagged {STACK_TAG}={settings.stack} and "
            f"{GROUP_TAG}={group} in {settings.region}"
        )
    return sorted(found, key=lambda h: (h.instance_id, h.address))
