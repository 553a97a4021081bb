"""The gateway's keys, read again from Secrets Manager every ``keys_reload_s`` and on SIGHUP.

Two things come from secrets: each tenant's key digests (who may call) and each pool's runtime keys
(the first of a pool's secret is what the gateway presents to that pool's runtimes; all of them are
the synthetic probe's tenant's). A reload reads them all, builds a whole new :class:`Tenants`, and
only then swaps it in with the upstream keys, so a request is judged against one complete set. A
reload that fails anywhere keeps everything in use and is counted: one unreadable tenant secret
must not lock every tenant out.

A pool's upstream key is the first of its runtimes' secret; ``fab keys.rotate`` puts the new key
first only once every runtime of the pool accepts it, and retires the old one no sooner than one interval later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from frontier_hostside import names
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from frontier_gateway.app import Gateway
from frontier_gateway.tenants import read_keys

log = logging.getLogger("frontier_gateway.keys")


class KeyReloader:
    def __init__(self, gateway: Gateway, registry: CollectorRegistry, *, client: Any | None = None) -> None:
        self.gateway = gateway
        self._client = client
        self.loaded_at = time.time()  # the gateway was built from the secrets just now
        self.failures = Counter(
            names.GATEWAY_KEYS_RELOAD_FAILURES_METRIC,
            "reloads of tenant or upstream keys that failed (the keys in use stay)",
            registry=registry,
        )
        registry.register(_KeysCollector(self))

    @property
    def uses_secrets(self) -> bool:
        """False where every key is inline in the config: nothing to reload."""
        config = self.gateway.config
        return any(p.api_keys_secret for p in config.models) or any(t.api_key_secret for t in config.tenants)

    def _secrets(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("secretsmanager")
        return self._client

    def reload(self, why: str) -> bool:
        """Read every key secret and swap; blocking (run it in a thread). False: kept what was in use."""
        config = self.gateway.config
        try:
            tenants, upstream = read_keys(config, self._secrets() if self.uses_secrets else None)
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the keys in use stay
            self.failures.inc()
            log.warning(f"key reload failed, keeping the keys in use: {exc}")
            return False
        gw = self.gateway
        gw.tenants = tenants
        gw.upstream_auth = upstream
        if gw.proxy is not None:
            gw.proxy.upstream_auth = upstream
            gw.proxy.migrator.upstream_auth = upstream
        self.loaded_at = time.time()
        log.debug(f"keys reloaded ({why})")
        return True

    async def run_forever(self, wake: asyncio.Event) -> None:
        """Reload every ``keys_reload_s``, or at once when ``wake`` is set (SIGHUP)."""
        while True:
            why = "schedule"
            try:
                await asyncio.wait_for(wake.wait(), timeout=self.gateway.config.keys_reload_s)
                why = "sighup"
            except TimeoutError:
                pass
            wake.clear()
            await asyncio.to_thread(self.reload, why)


class _KeysCollector(Collector):
    def __init__(self, reloader: KeyReloader) -> None:
        self.reloader = reloader

    def collect(self):  # type: ignore[no-untyped-def]
        yield GaugeMetricFamily(
            names.GATEWAY_KEYS_AGE_METRIC,
            "seconds since the tenant and upstream keys in use were loaded",
            max(0.0, time.time() - self.reloader.loaded_at),
        )
        yield GaugeMetricFamily(
            names.GATEWAY_KEYS_LOADED_METRIC,
            "tenant key digests in use",
            self.reloader.gateway.tenants.key_count,
        )
