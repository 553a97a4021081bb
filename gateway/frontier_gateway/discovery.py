"""Replicas the gateway finds rather than is given: each pool's (or half's) runtimes, asked for every
``interval_s`` (the prober then marks a new one ready once it answers its readiness path).

- **EC2** (:class:`Ec2Finder`): the running instances tagged with a pool's stack, node group and role.
  Auto scaling adds and replaces runtime hosts.
- **Kubernetes** (:class:`EndpointSliceFinder`): the ready endpoints of the pool's Service's
  EndpointSlices, each pod a replica at the runtime's container port — not the Service's one
  address, through which kube-proxy would pick the pod: KV-aware routing, least-loaded choice and a
  migration to *another* replica all need to know which pod they reach. A pod leaves when the
  EndpointSlice controller marks it not ready (failing readiness, terminating).

A round that fails keeps the last known replicas and is logged; the next round asks again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from frontier_hostside import names

from frontier_gateway.config import Discovery, Ec2Discovery, KubernetesDiscovery
from frontier_gateway.pools import Pool

log = logging.getLogger("frontier_gateway.discovery")

#: The label EndpointSlices carry naming their Service (discovery.k8s.io/v1).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class Finder(Protocol):
    """What one kind of discovery answers: the base URLs of the replicas it finds now, sorted."""

    interval_s: float

    def find(self) -> list[str]: ...


class Ec2Finder:
    def __init__(self, spec: Ec2Discovery, client: Any | None = None) -> None:
        if client is None:
            import boto3

            client = boto3.client("ec2", region_name=spec.region)
        self.spec, self.client, self.interval_s = spec, client, spec.interval_s

    def find(self) -> list[str]:
        spec = self.spec
        filters = [
            {"Name": f"tag:{names.STACK_TAG}", "Values": [spec.stack]},
            {"Name": f"tag:{names.NODE_GROUP_TAG}", "Values": [spec.node_group]},
            {"Name": f"tag:{names.ROLE_TAG}", "Values": [names.RUNTIME_ROLE]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
        urls = []
        for page in self.client.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    address = instance.get("PrivateIpAddress")
                    if address:
                        urls.append(f"http://{address}:{spec.port}")
        return sorted(urls)


class EndpointSliceFinder:
    def __init__(self, spec: KubernetesDiscovery) -> None:
        import httpx  # the gateway's own HTTP client, synchronous here: a round runs in a thread

        self.spec, self.interval_s = spec, spec.interval_s
        base = spec.api_url or _in_cluster_url()
        verify: Any = spec.ca_file if base.startswith("https://") and Path(spec.ca_file).is_file() else True
        self.url = f"{base}/apis/discovery.k8s.io/v1/namespaces/{spec.namespace}/endpointslices"
        self.client = httpx.Client(verify=verify, timeout=10.0)

    def find(self) -> list[str]:
        spec = self.spec
        answer = self.client.get(
            self.url,
            params={"labelSelector": f"{SERVICE_NAME_LABEL}={spec.service}"},
            headers=self._auth(),
        )
        answer.raise_for_status()
        urls = {
            f"http://{_host(address)}:{spec.port}"
            for item in answer.json().get("items") or ()
            for endpoint in item.get("endpoints") or ()
            # An unknown readiness reads as ready (the API's own advice); a terminating pod is not.
            if (endpoint.get("conditions") or {}).get("ready") is not False
            for address in endpoint.get("addresses") or ()
        }
        return sorted(urls)

    def _auth(self) -> dict[str, str]:
        token = Path(self.spec.token_file)
        # Read at every round: a projected token is renewed on disk before it expires.
        return {"Authorization": f"Bearer {token.read_text().strip()}"} if token.is_file() else {}


def _in_cluster_url() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("kubernetes discovery: no api_url and not in a pod (KUBERNETES_SERVICE_HOST unset)")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


#: Each kind of discovery's finder, by the kind of its settings.
FINDERS: dict[type, Callable[[Any], Finder]] = {Ec2Discovery: Ec2Finder, KubernetesDiscovery: EndpointSliceFinder}


def finder_for(spec: Discovery) -> Finder:
    return FINDERS[type(spec)](spec)


def discover(client: Any, spec: Ec2Discovery) -> list[str]:
    """Base URLs of the running runtime hosts of ``spec``'s node group, sorted."""
    return Ec2Finder(spec, client).find()


async def find_once(pool: Pool, finder: Finder) -> None:
    """One round: ``pool``'s replicas become what ``finder`` finds; a failed round keeps the last
    known ones (none, at start: the pool holds or refuses until a round succeeds)."""
    try:
        pool.set_urls(await asyncio.to_thread(finder.find))
    except Exception:  # noqa: BLE001 - keep the last known replicas; try again next round
        log.exception("discovery failed", extra={"event": "discovery_failed", "model": pool.name})


async def follow(pool: Pool, finder: Finder) -> None:
    """Keep ``pool``'s replicas equal to what ``finder`` finds, forever (after the first round)."""
    while True:
        await asyncio.sleep(finder.interval_s)
        await find_once(pool, finder)
