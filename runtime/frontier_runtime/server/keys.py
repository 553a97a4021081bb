"""The API keys, read again from Secrets Manager every ``api_keys_reload_s`` and on SIGHUP.

A reload builds a complete new :class:`ApiKeys` off the event loop and then swaps the one
reference the app reads, so each request is judged against the whole old set or the whole new
one. A reload that fails (the secret unreadable, deleted, or holding no usable key) keeps the set
in use, logs why and counts it in ``frontier_api_keys_reload_failures_total``: a bad write to the
secret must not lock every client out, and the age gauge shows how long the set has been stale.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from frontier_runtime.server.auth import ApiKeys
from frontier_runtime.server.state import ServerState
from frontier_runtime.storage.secrets import load_api_keys

log = logging.getLogger("frontier_runtime.keys")


class KeyReloader:
    def __init__(self, state: ServerState, secret_id: str, *, client: Any | None = None) -> None:
        self.state = state
        self.secret_id = secret_id
        self._client = client
        # The schedule and SIGHUP may both ask at once; one read at a time keeps the newest write last.
        self._lock = threading.Lock()

    def _secrets(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("secretsmanager")
        return self._client

    def reload(self, why: str) -> bool:
        """Read the secret and swap the key set; blocking (run it in a thread). False: kept the old set."""
        with self._lock:
            try:
                keys = ApiKeys(load_api_keys(self.secret_id, client=self._secrets()))
            except Exception as exc:  # noqa: BLE001 - whatever went wrong, the set in use stays
                self.state.metrics.key_reload_failures.inc()
                log.warning(
                    f"api key reload failed, keeping the keys in use: {exc}",
                    extra={
                        "event": "api_keys_reload_failed",
                        "reason": why,
                        "error": str(exc),
                        "kept": len(self.state.api_keys or ()),
                    },
                )
                return False
            before = self.state.api_keys
            self.state.api_keys = keys
            self.state.api_keys_loaded_at = time.time()
        changed = before is None or before.fingerprint != keys.fingerprint
        log.log(
            logging.INFO if changed else logging.DEBUG,
            "api keys reloaded",
            extra={
                "event": "api_keys_reloaded",
                "reason": why,
                "count": len(keys),
                "fingerprint": keys.fingerprint,
                "changed": changed,
            },
        )
        return True

    async def run_forever(self, interval_s: float, wake: asyncio.Event) -> None:
        """Reload every ``interval_s``, or at once when ``wake`` is set (SIGHUP)."""
        while True:
            why = "schedule"
            try:
                await asyncio.wait_for(wake.wait(), timeout=interval_s)
                why = "sighup"
            except TimeoutError:
                pass
            wake.clear()
            await asyncio.to_thread(self.reload, why)
