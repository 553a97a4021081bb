"""Model pools: which replicas serve a model, which are ready, and which one takes a request.

Selection is least-outstanding-requests among ready replicas (ties rotate). With an affinity key
(a session header or the hash of the prompt's prefix) the replica comes from rendezvous hashing
over the ready replicas, so a conversation keeps landing where its prefix is cached and only the
keys of a replica that leaves move; the affine replica is left only when it holds
``max_imbalance`` more requests than the least loaded one.

Readiness comes from active probes of each replica's readiness path and, between probes, from
the proxy: a replica that refused a connection is out until a probe finds it ready again.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import httpx

from frontier_gateway.config import PoolConfig, ProbeConfig

log = logging.getLogger("frontier_gateway.pools")


@dataclass
class Replica:
    url: str
    ready: bool = False
    outstanding: int = 0

    def mark_down(self) -> None:
        if self.ready:
            log.warning("replica down", extra={"event": "replica_down", "replica": self.url})
        self.ready = False


class Pool:
    def __init__(self, name: str, urls: Iterable[str], max_imbalance: int = 8) -> None:
        self.name = name
        self.replicas = [Replica(url) for url in urls]
        self.max_imbalance = max_imbalance
        self._turn = itertools.count()

    def set_urls(self, urls: Iterable[str]) -> None:
        """The replicas a discovery found: known ones keep their state, new ones wait for a probe."""
        known = {r.url: r for r in self.replicas}
        self.replicas = [known.get(url) or Replica(url) for url in dict.fromkeys(urls)]

    @property
    def ready_count(self) -> int:
        return sum(r.ready for r in self.replicas)

    def choose(self, affinity_key: str | None = None, exclude: Iterable[str] = ()) -> Replica | None:
        """A ready replica not in ``exclude``; None when there is none."""
        skip = set(exclude)
        ready = [r for r in self.replicas if r.ready and r.url not in skip]
        if not ready:
            return None
        least = min(r.outstanding for r in ready)
        if affinity_key is not None:
            affine = max(ready, key=lambda r: _rendezvous(affinity_key, r.url))
            if affine.outstanding - least < self.max_imbalance:
                return affine
        lightest = [r for r in ready if r.outstanding == least]
        return lightest[next(self._turn) % len(lightest)]


def _rendezvous(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest(), "big")


class Pools:
    def __init__(self, configs: Iterable[PoolConfig], max_imbalance: int = 8) -> None:
        self.by_model = {c.name: Pool(c.name, c.replicas, max_imbalance) for c in configs}

    def get(self, model: str) -> Pool | None:
        return self.by_model.get(model)

    def ready(self) -> bool:
        """True only while every model has at least one ready replica."""
        return all(pool.ready_count for pool in self.by_model.values())

    def summary(self) -> dict[str, dict[str, int]]:
        return {
            name: {"ready": p.ready_count, "replicas": len(p.replicas)} for name, p in self.by_model.items()
        }

    async def probe_once(self, client: httpx.AsyncClient, path: str, probe: ProbeConfig) -> None:
        replicas = [r for pool in self.by_model.values() for r in pool.replicas]
        results = await asyncio.gather(*(_probe(client, r.url + path, probe.timeout_s) for r in replicas))
        for replica, ok in zip(replicas, results, strict=True):
            if ok and not replica.ready:
                log.info("replica ready", extra={"event": "replica_ready", "replica": replica.url})
            if not ok:
                replica.mark_down()
            replica.ready = ok

    async def probe_forever(self, client: httpx.AsyncClient, path: str, probe: ProbeConfig) -> None:
        while True:
            await self.probe_once(client, path, probe)
            await asyncio.sleep(probe.interval_s)


async def _probe(client: httpx.AsyncClient, url: str, timeout_s: float) -> bool:
    try:
        response = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return response.status_code == 200
