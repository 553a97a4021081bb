"""Model pools: which replicas serve a model, which are ready, and which one takes a request.

Selection is least-outstanding-requests among ready replicas (ties rotate). With an affinity key
(a session header or the hash of the prompt's prefix) the replica comes from rendezvous hashing
over the ready replicas, so a conversation keeps landing where its prefix is cached and only the
keys of a replica that leaves move; the affine replica is left only when it holds
``max_imbalance`` more requests than the least loaded one.

Readiness comes from active probes of each replica's readiness path and, between probes, from
the proxy: a replica that refused a connection is out until a probe finds it ready again. A ready
replica whose answers keep failing is out while its circuit breaker is open (``breaker.py``).

A model may name an offline pool (``PoolConfig.offline``): its batch requests go there and never to
its own replicas, so batch work does not take the replicas interactive requests wait for.

A pool with a hold queue (``hold.py``) keeps requests that find no available replica until a probe
finds one ready, instead of refusing them at once: how a pool scales from zero without losing one.

Clients see a replica only by its opaque id (a keyed hash of its URL), never its address: without
the key, hashing every private address and port would not find which one it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
from frontier_hostside.names import BATCH

from frontier_gateway.breaker import Breaker
from frontier_gateway.config import BreakerConfig, HoldConfig, PoolConfig, ProbeConfig
from frontier_gateway.hold import HoldQueue
from frontier_gateway.kv_index import KvRouting

if TYPE_CHECKING:
    from frontier_gateway.disaggregation import Disaggregated

log = logging.getLogger("frontier_gateway.pools")


def replica_id(url: str, key: bytes) -> str:
    """What clients may see of a replica: stable while ``key`` is, and says nothing of its address."""
    return hashlib.blake2b(url.encode(), digest_size=6, key=key).hexdigest()


@dataclass
class Replica:
    url: str
    breaker_config: BreakerConfig = field(default_factory=BreakerConfig)
    id_key: bytes = b""
    ready: bool = False
    outstanding: int = 0

    def __post_init__(self) -> None:
        self.id = replica_id(self.url, self.id_key)
        self.breaker = Breaker(self.breaker_config, self.id)
        # The Host header of requests forwarded to it: the URL's authority.
        self.host = urlsplit(self.url).netloc

    def mark_down(self) -> None:
        if self.ready:
            log.warning("replica down", extra={"event": "replica_down", "replica": self.url})
        self.ready = False


class Pool:
    def __init__(
        self,
        name: str,
        urls: Iterable[str],
        max_imbalance: int = 8,
        breaker: BreakerConfig | None = None,
        id_key: bytes = b"",
    ) -> None:
        self.name = name
        self.breaker = breaker or BreakerConfig()
        self.id_key = id_key
        self.replicas = [Replica(url, self.breaker, id_key) for url in urls]
        self.max_imbalance = max_imbalance
        self._turn = itertools.count()
        # Requests held while no replica is available (gateway.hold); None: a 503 at once.
        self.hold: HoldQueue | None = None
        # Routing by the replicas' KV events (kv_index.py); None: the affinity key's rendezvous hash.
        self.kv: KvRouting | None = None
        # Prefill and decode replicas taking its requests in two hops (disaggregation.py); None: none.
        self.disaggregated: Disaggregated | None = None

    def set_urls(self, urls: Iterable[str]) -> None:
        """The replicas a discovery found: known ones keep their state, new ones wait for a probe."""
        known = {r.url: r for r in self.replicas}
        self.replicas = [
            known.get(url) or Replica(url, self.breaker, self.id_key) for url in dict.fromkeys(urls)
        ]
        if self.kv is not None:  # a replica that left takes its index entries with it
            self.kv.subscriber.sync(r.url for r in self.replicas)

    @property
    def ready_count(self) -> int:
        return sum(r.ready for r in self.replicas)

    def available(self, exclude: Iterable[str] = ()) -> list[Replica]:
        """Ready replicas not in ``exclude`` whose breaker lets a request through."""
        skip = set(exclude)
        return [r for r in self.replicas if r.ready and r.url not in skip and r.breaker.available()]

    def choose(
        self, affinity_key: str | None = None, exclude: Iterable[str] = (), kv_keys: list[int] | None = None
    ) -> Replica | None:
        """A ready replica not in ``exclude``, claimed for one request (a half-open breaker's one
        trial); None when there is none. With KV routing, ``kv_keys`` (the request's block keys)
        pick it instead of the affinity key."""
        ready = self.available(exclude)
        if not ready:
            return None
        least = min(r.outstanding for r in ready)
        chosen = None
        if self.kv is not None:
            chosen, _ = self.kv.index.choose(ready, kv_keys, self.kv.without_keys)
            if chosen.outstanding - least >= self.max_imbalance:
                chosen = None
            elif kv_keys:
                self.kv.index.routed(chosen.url, kv_keys)
        elif affinity_key is not None:
            affine = max(ready, key=lambda r: _rendezvous(affinity_key, r.url))
            if affine.outstanding - least < self.max_imbalance:
                chosen = affine
        if chosen is None:
            lightest = [r for r in ready if r.outstanding == least]
            chosen = lightest[next(self._turn) % len(lightest)]
        chosen.breaker.claim()
        return chosen

    def retry_after_s(self) -> float:
        """When a replica of a pool with none available may take a request again: the soonest end of
        an open breaker's cool-off; a second (about a probe round) when none is open."""
        waits = [r.breaker.retry_after_s() for r in self.replicas if r.ready and r.breaker.retry_after_s()]
        return min(waits) if waits else 1.0


def _rendezvous(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest(), "big")


class Pools:
    def __init__(
        self,
        configs: Iterable[PoolConfig],
        max_imbalance: int = 8,
        breaker: BreakerConfig | None = None,
        id_key: bytes | None = None,
    ) -> None:
        """``id_key``: the key of the replicas' public ids; the gateways of a stack share one so a
        replica has one id whichever gateway answers (default: this process's own)."""
        key = secrets.token_bytes(32) if id_key is None else id_key
        configs = tuple(configs)
        self.by_model = {c.name: Pool(c.name, c.replicas, max_imbalance, breaker, key) for c in configs}
        #: Model -> the pool that takes its batch work, where it names one (PoolConfig.offline).
        self.offline = {c.name: c.offline for c in configs if c.offline}
        for c in configs:
            if c.kv_routing is not None:
                pool = self.by_model[c.name]
                pool.kv = KvRouting(c.kv_routing, c.replicas, c.name)
            if c.disaggregation is not None:
                from frontier_gateway.disaggregation import Disaggregated  # it builds on Pool

                self.by_model[c.name].disaggregated = Disaggregated(
                    c.name, c.disaggregation, breaker or BreakerConfig(), key
                )

    def get(self, model: str) -> Pool | None:
        return self.by_model.get(model)

    def route(self, model: str, priority: str) -> Pool:
        """The pool that takes a request for ``model`` (one of :attr:`by_model`) of ``priority``: the
        model's own, or for batch work the offline pool it names (whose runtimes answer to the
        model's name)."""
        offline = self.offline.get(model)
        return self.by_model[offline if offline is not None and priority == BATCH else model]

    def set_holds(self, holds: dict[str, HoldConfig]) -> None:
        """Give each pool named in ``holds`` its hold queue (gateway.hold)."""
        for name, config in holds.items():
            self.by_model[name].hold = HoldQueue(name, config)

    def release_held(self) -> None:
        """Let the held requests of every pool with an available replica go to it."""
        for pool in self.by_model.values():
            if pool.hold is not None and pool.hold.waiting and pool.available():
                pool.hold.release()

    def ready(self) -> bool:
        """True only while every model can take a request: it has a ready replica, or a hold queue
        its requests wait in while one starts (a pool at zero must stay reachable: its requests
        are what starts it). An offline pool does not count: batch work waits or is refused there,
        and a gateway out of its balancer would refuse interactive work too."""
        takers = set(self.offline.values())
        return all(
            pool.ready_count
            or pool.hold is not None
            or (pool.disaggregated and pool.disaggregated.ready_count)
            for name, pool in self.by_model.items()
            if name not in takers
        )

    def summary(self) -> dict[str, dict[str, int]]:
        return {
            name: {"ready": p.ready_count, "replicas": len(p.replicas)} for name, p in self.by_model.items()
        }

    async def probe_once(self, client: httpx.AsyncClient, path: str, probe: ProbeConfig) -> None:
        replicas = [r for pool in self.by_model.values() for r in pool.replicas]
        replicas += [
            r for pool in self.by_model.values() if pool.disaggregated for r in pool.disaggregated.replicas()
        ]
        results = await asyncio.gather(*(_probe(client, r.url + path, probe.timeout_s) for r in replicas))
        for replica, ok in zip(replicas, results, strict=True):
            if ok and not replica.ready:
                log.info("replica ready", extra={"event": "replica_ready", "replica": replica.url})
            if not ok:
                replica.mark_down()
            replica.ready = ok
        self.release_held()

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
