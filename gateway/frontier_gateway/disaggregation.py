"""Prefill/decode disaggregation: a request of a disaggregated pool goes in two hops, as vLLM's
disaggregation proxy sends it.

1. The prompt goes to the least-loaded ready **prefill** replica as a non-streamed request with
   ``max_tokens: 1`` and ``kv_transfer_params: {do_remote_decode: true}``; its answer's
   ``kv_transfer_params`` say where the prompt's KV blocks wait (under a lease).
2. The client's own request, with those ``kv_transfer_params`` added, goes to the least-loaded
   ready **decode** replica through the proxy's ordinary path (retries, streaming to the client,
   usage and metering); the decode replica pulls the blocks and generates the whole answer.

When the pool has no ready prefill or no ready decode replica, the request takes the ordinary
path over the pool's colocated replicas. When the prefill hop fails (refused, an error status,
no ``kv_transfer_params`` in its answer), the decode replica gets the request without them and
computes the prompt itself: the client never sees the first hop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from frontier_hostside import names
from starlette.responses import Response

from frontier_gateway.config import BreakerConfig, DisaggregationRouting
from frontier_gateway.pools import Pool, Replica
from frontier_gateway.upstream import Upstream, UpstreamError

if TYPE_CHECKING:
    from frontier_gateway.proxy import Call

log = logging.getLogger("frontier_gateway.disaggregation")

# Fields of the client's request that do not apply to the one-token prefill hop.
_PREFILL_DROPS = ("stream", "stream_options", "max_completion_tokens", "n", "logprobs", "top_logprobs")


class Disaggregated:
    """The prefill and decode replicas of one pool, each probed and chosen by load like a pool's."""

    def __init__(
        self, name: str, config: DisaggregationRouting, breaker: BreakerConfig, id_key: bytes
    ) -> None:
        self.prefill = Pool(f"{name}/prefill", config.prefill, breaker=breaker, id_key=id_key)
        self.decode = Pool(f"{name}/decode", config.decode, breaker=breaker, id_key=id_key)
        self.handed_over = 0  # requests that went through both hops with KV handed over
        self.prefill_failed = 0  # requests whose prefill hop failed: the decode computed the prompt

    def replicas(self) -> Iterable[Replica]:
        return [*self.prefill.replicas, *self.decode.replicas]

    @property
    def ready_count(self) -> int:
        """Disaggregated capacity that can take a request: a decode replica (it can prefill too)."""
        return self.decode.ready_count

    async def forward(
        self,
        call: Call,
        upstream: Upstream,
        upstream_auth: str | None,
        decode_hop: Callable[[Call, Pool], Awaitable[Response]],
    ) -> Response | None:
        """The answer through both hops; None when no prefill or no decode replica is available
        (the caller then serves the request from the pool's colocated replicas)."""
        if not self.decode.available():
            return None
        prefill = self.prefill.choose()
        if prefill is None:
            return None
        try:
            request = json.loads(call.body)
        except ValueError:
            return None  # not JSON: the ordinary path answers the client's error
        if not isinstance(request, dict):
            return None
        params = await self._prefill(call, request, prefill, upstream, upstream_auth)
        if params is None:
            self.prefill_failed += 1
        else:
            self.handed_over += 1
            request["kv_transfer_params"] = params
        call.body = json.dumps(request).encode()
        return await decode_hop(call, self.decode)

    async def _prefill(
        self, call: Call, request: dict[str, Any], replica: Replica, upstream: Upstream, auth: str | None
    ) -> dict[str, Any] | None:
        body = {k: v for k, v in request.items() if k not in _PREFILL_DROPS}
        body.update(max_tokens=1, stream=False, kv_transfer_params={"do_remote_decode": True})
        headers = {
            "host": replica.host,
            "content-type": "application/json",
            names.REQUEST_ID_HEADER: f"{call.request_id}-prefill",
        }
        if auth:
            headers["authorization"] = f"Bearer {auth}"
        replica.outstanding += 1
        outcome = 0
        try:
            answer = await upstream.post(replica.url + call.path, headers, json.dumps(body).encode())
            try:
                content = await answer.read()
            finally:
                await answer.aclose()
            outcome = answer.status
            if answer.status != 200:
                log.warning(
                    "prefill hop refused",
                    extra={"event": "prefill_failed", "replica": replica.url, "status": answer.status},
                )
                return None
            params = json.loads(content).get("kv_transfer_params")
            return params if isinstance(params, dict) and params.get("do_remote_prefill") else None
        except (UpstreamError, ValueError, AttributeError) as exc:
            log.warning(
                "prefill hop failed",
                extra={"event": "prefill_failed", "replica": replica.url, "error": repr(exc)},
            )
            if isinstance(exc, UpstreamError):
                replica.mark_down()
            return None
        finally:
            replica.outstanding -= 1
            replica.breaker.record(outcome)
