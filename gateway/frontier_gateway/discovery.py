"""Replicas found on EC2: the running instances tagged with a pool's stack, node group and role.

Auto scaling adds and replaces runtime hosts; the gateway follows by asking EC2 every
``interval_s`` (the prober then marks a new host ready once it answers its readiness path).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from frontier_hostside import names

from frontier_gateway.config import Ec2Discovery
from frontier_gateway.pools import Pool

log = logging.getLogger("frontier_gateway.discovery")


def discover(client: Any, spec: Ec2Discovery) -> list[str]:
    """Base URLs of the running runtime hosts of ``spec``'s node group, sorted."""
    filters = [
        {"Name": f"tag:{names.STACK_TAG}", "Values": [spec.stack]},
        {"Name": f"tag:{names.NODE_GROUP_TAG}", "Values": [spec.node_group]},
        {"Name": f"tag:{names.ROLE_TAG}", "Values": [names.RUNTIME_ROLE]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    urls = []
    for page in client.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                address = instance.get("PrivateIpAddress")
                if address:
                    urls.append(f"http://{address}:{spec.port}")
    return sorted(urls)


async def follow(pool: Pool, spec: Ec2Discovery, client: Any | None = None) -> None:
    """Keep ``pool``'s replicas equal to what EC2 says runs, forever."""
    if client is None:
        import boto3

        client = boto3.client("ec2", region_name=spec.region)
    while True:
        try:
            pool.set_urls(await asyncio.to_thread(discover, client, spec))
        except Exception:  # noqa: BLE001 - keep the last known replicas; try again next round
            log.exception("discovery failed", extra={"event": "discovery_failed", "model": pool.name})
        await asyncio.sleep(spec.interval_s)
