"""Migration of in-flight generations: a stream whose replica fails carries on at another one.

The gateway asks each replica for the token ids of every streamed chunk (``names.TOKEN_IDS_HEADER``;
the runtime puts them in ``choices[0].token_ids``, which the gateway takes out before the client
sees the chunk) and counts the characters of text the client has received. When the replica
serving a stream fails after bytes reached the client — the connection resets or ends short of
the answer, the read times out, the replica sends an error event or ends the generation with
finish_reason "abort" (its drain ran out, its engine stopped), or the gateway is told the
replica is going away (``Migrator.interrupt``: a spot or capacity notice) — the gateway sends the
same request to another replica with ``names.CONTINUATION_FIELD``: the token ids generated so far
and the characters already sent. That replica tokenises the prompt as the first did, appends the
generated tokens, counts them against max_tokens, rebuilds a constraint's grammar state by
feeding them through it, advances a seeded generator past their draws, and streams only what
follows; its chunks go on to the client under the first stream's id and creation time. The
client sees no error event and no repeated text; a greedy output equals the uninterrupted run.

A request moves at most ``migration_limit`` times (each attempt at another replica counts);
past that, or with no replica to take it, the stream ends with an error event naming why. Where
no replica is ready at all (the pool's only one died while the next still starts) and the pool has
a hold queue (``gateway.hold``, as for scale from zero), the continuation waits there like a new
request, up to the hold's timeout, and goes on at the first replica the prober finds ready; past
the timeout (or with the queue full) the stream ends with the hold's error event. A
non-streamed request is forwarded as a stream (usage included) so that its progress is known,
and the gateway assembles the one JSON answer the client asked for from the chunks; one that
cannot stream upstream (``echo``) keeps the plain retry of a request nothing was sent for.

Metrics: migrations by reason, the stall each one added (from the failure to the continuation's
first chunk), and migrations that failed by why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from frontier_hostside import names
from frontier_settings.openai_errors import error_body
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from frontier_gateway.errors import GatewayError
from frontier_gateway.pools import Pool, Replica
from frontier_gateway.tenants import UpstreamKeys
from frontier_gateway.upstream import Answer, Upstream, UpstreamError

if TYPE_CHECKING:
    from frontier_gateway.metrics import Metrics
    from frontier_gateway.proxy import Call

log = logging.getLogger("frontier_gateway.migration")

DONE = b"data: [DONE]\n\n"
# Statuses of a continuation attempt that another replica may answer better; any other refusal
# (a 400: the continuation itself is wrong) ends the stream with that error.
RETRYABLE = frozenset({429, 502, 503, 504})
# How long a finished generation's answer may take to end after its [DONE].
FINISH_WAIT_S = 1.0
# Error codes a non-streamed request is answered 503 for (no replica now: try again later), not 502.
UNAVAILABLE = frozenset(
    {"queue_timeout", "engine_unavailable", "draining", "hold_timeout", "hold_queue_full"}
)


@dataclass
class Progress:
    """What one generation has delivered to its client so far."""

    token_ids: list[int] = field(default_factory=list)
    emitted_chars: int = 0  # characters of the choice's text the client has
    finished: bool = False  # a finish_reason reached the client
    done: bool = False  # [DONE] reached the client
    response_id: str | None = None  # the first stream's id and creation time, kept across moves
    created: int | None = None
    usage: dict[str, Any] | None = None
    moved: bool = False  # continued at another replica: chunks get the first stream's id


# The ids field as the runtime writes it (compact JSON, last in its choice).
_TOKEN_IDS = re.compile(rb',"token_ids":\[[0-9,]*\]')


@dataclass
class _Hop:
    """One replica's part of a migrating stream."""

    replica: Replica
    answer: Answer
    events: AsyncIterator[list[bytes]]
    interrupted: bool = False


@dataclass
class Outcome:
    """How a relayed generation ended: its status for metering and the replica that finished it."""

    status: int = 200
    replica: str = ""
    migrations: int = 0
    stalls_s: list[float] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    chunks: list[dict[str, Any]] = field(default_factory=list)  # a non-streamed request's, parsed


class Migrator:
    def __init__(self, upstream: Upstream, metrics: Metrics, limit: int, upstream_auth: UpstreamKeys) -> None:
        self.upstream = upstream
        self.upstream_auth = upstream_auth
        self.metrics = metrics
        self.limit = limit
        # The hops streaming from each replica (by URL): what ``interrupt`` moves.
        self._active: dict[str, set[int]] = {}
        self._hops: dict[int, _Hop] = {}

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    # -- the request --------------------------------------------------------------------------------

    def upstream_body(self, call: Call) -> tuple[bytes, bool]:
        """The body to send upstream and whether it streams: a non-streamed request goes up as a
        stream (its progress is then known) unless it cannot (completions' echo)."""
        if call.stream or not self.enabled:
            return call.body, call.stream
        body = json.loads(call.body)
        if body.get("echo"):
            return call.body, False
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return json.dumps(body).encode(), True

    def continuation(self, body: bytes, progress: Progress) -> bytes:
        data = json.loads(body)
        data[names.CONTINUATION_FIELD] = {
            "token_ids": progress.token_ids,
            "emitted_chars": progress.emitted_chars,
        }
        return json.dumps(data).encode()

    # -- interruption -------------------------------------------------------------------------------

    def interrupt(self, url: str) -> int:
        """Move every stream now served by the replica at ``url`` to another one (a notice that it
        goes away); returns how many. Call on the gateway's event loop."""
        moved = 0
        for key in list(self._active.get(url, ())):
            hop = self._hops.get(key)
            if hop is not None and not hop.interrupted:
                hop.interrupted = True
                hop.answer.interrupt("the replica was interrupted (notice)")
                moved += 1
        return moved

    # -- the relay ----------------------------------------------------------------------------------

    async def relay(
        self,
        call: Call,
        pool: Pool,
        replica: Replica,
        answer: Answer,
        held: list[bytes],
        events: AsyncIterator[list[bytes]],
        outcome: Outcome,
        open_hop: Callable[[Replica, dict[str, str]], None],
        close_hop: Callable[[Replica, int | None], None],
    ) -> AsyncGenerator[bytes, None]:
        """The client's bytes of one generation, moved to another replica as often as needed.

        ``open_hop``/``close_hop``: the proxy's bookkeeping of an attempt at a replica (its
        outstanding count, the trace's span; close gets the outcome for the breaker)."""
        progress = outcome.progress
        # A non-streamed answer is assembled from the chunks: its usage is the usage chunk's.
        keep_usage = call.client_wants_usage or not call.stream
        collect = outcome.chunks if not call.stream else None
        hop = _Hop(replica, answer, events)
        tried = [replica.url]
        batch: list[bytes] | None = held
        failed_at: float | None = None  # when the stream broke, until the next chunk reaches the client
        attempts = 0
        self._track(hop)
        try:
            while True:
                why: str | None = None
                error_event: bytes | None = None
                try:
                    while batch is not None:
                        out: list[bytes] = []
                        for event in batch:
                            kept, why, error_event = self._take(event, progress, keep_usage, collect)
                            if why is not None:
                                break
                            if kept is not None:
                                out.append(kept)
                        if out:
                            if failed_at is not None:
                                stall = time.monotonic() - failed_at
                                outcome.stalls_s.append(stall)
                                self.metrics.migration_stall.labels(call.model).observe(stall)
                                failed_at = None
                            yield b"".join(out)
                        if why is not None or progress.done:
                            break
                        batch = await anext(hop.events, None)
                    if why is None and not progress.done:
                        why = "died"  # the answer ended without its end: the replica went away
                    if why is None:
                        await _finish(hop.events)
                except UpstreamError as exc:
                    why = "interrupted" if hop.interrupted else "died"
                    log.warning(
                        "replica failed mid-stream",
                        extra={"event": "upstream_error", "replica": hop.replica.url, "error": repr(exc)},
                    )
                self._untrack(hop)
                await hop.answer.aclose()
                if why is None:
                    close_hop(hop.replica, 200)
                    outcome.replica = hop.replica.url
                    return
                broken = why == "died"
                if broken:
                    hop.replica.mark_down()
                close_hop(hop.replica, 0 if broken else None)
                if progress.finished:
                    # The choice ended; only the usage or [DONE] went missing.
                    outcome.replica = hop.replica.url
                    yield DONE
                    return
                failed_at = failed_at or time.monotonic()
                moved: tuple[_Hop, list[bytes]] | None = None
                refusal: bytes | None = None
                held_out = ""  # the hold queue's refusal code, when no replica came in time
                while moved is None and refusal is None and attempts < self.limit:
                    attempts += 1
                    try:
                        moved, refusal = await self._move(call, pool, tried, progress, open_hop, close_hop)
                    except GatewayError as held:
                        refusal, held_out = _error_event(held), held.code
                if moved is None:
                    outcome.status = 502
                    outcome.replica = hop.replica.url
                    reason = held_out or (
                        "refused"
                        if refusal is not None
                        else ("limit" if attempts >= self.limit else "no_replica")
                    )
                    self.metrics.migration_failures.labels(call.model, reason).inc()
                    yield refusal or error_event or _limit_event(self.limit, attempts, why, reason)
                    return
                self.metrics.migrations.labels(call.model, why).inc()
                outcome.migrations += 1
                log.info(
                    "generation migrated",
                    extra={
                        "event": "migrated",
                        "request_id": call.request_id,
                        "reason": why,
                        "from": hop.replica.url,
                        "to": moved[0].replica.url,
                        "tokens": len(progress.token_ids),
                    },
                )
                hop, batch = moved
                progress.moved = True
                self._track(hop)
        except BaseException:
            outcome.status = 499  # the client left (or the gateway stops)
            self._untrack(hop)
            await hop.answer.aclose()
            close_hop(hop.replica, None)
            raise

    async def _move(
        self,
        call: Call,
        pool: Pool,
        tried: list[str],
        progress: Progress,
        open_hop: Callable[[Replica, dict[str, str]], None],
        close_hop: Callable[[Replica, int | None], None],
    ) -> tuple[tuple[_Hop, list[bytes]] | None, bytes | None]:
        """One attempt to continue at another replica: the new hop and its first events, or a
        refusal event that ends the stream, or neither (try again, within the limit)."""
        replica = pool.choose(call.affinity_key, tried, call.kv_keys)
        if replica is None:
            # Every other replica was tried or none is ready: one already tried may take it again.
            replica = pool.choose(call.affinity_key, [], call.kv_keys)
        if replica is None and pool.hold is not None:
            # None is ready: wait in the pool's hold queue for one to start, as a new request would
            # (the hold's GatewayError past its timeout). No disconnect watch of its own: a client
            # that leaves cancels this stream, and the wait with it.
            waited = await pool.hold.wait(call.priority, lambda: bool(pool.available()))
            log.info(
                "continuation held",
                extra={"event": "migration_held", "request_id": call.request_id, "held_s": round(waited, 3)},
            )
            replica = pool.choose(call.affinity_key, [], call.kv_keys)
        if replica is None:
            return None, None
        tried.append(replica.url)
        body = self.continuation(call.upstream_body or call.body, progress)
        headers = {
            "host": replica.host,
            "content-type": "application/json",
            names.REQUEST_ID_HEADER: call.request_id,
            names.TOKEN_IDS_HEADER: "1",
        }
        key = self.upstream_auth.get(pool.name)
        if key:
            headers["authorization"] = f"Bearer {key}"
        open_hop(replica, headers)
        try:
            answer = await self.upstream.post(replica.url + call.path, headers, body)
        except UpstreamError:
            replica.mark_down()
            close_hop(replica, 0)
            return None, None
        if answer.status != 200:
            content = b""
            with contextlib.suppress(UpstreamError):
                content = await answer.read()
            await answer.aclose()
            close_hop(replica, answer.status)
            if answer.status in RETRYABLE:
                return None, None
            return None, b"data: " + content + b"\n\n"
        events = answer.events()
        held: list[bytes] = []
        try:
            async for batch in events:
                held += batch
                if any(e.startswith(b"data:") for e in batch):
                    break
        except UpstreamError:
            held = []
        if not any(e.startswith(b"data:") for e in held):
            await answer.aclose()
            replica.mark_down()
            close_hop(replica, 0)
            return None, None
        replica.breaker.record(200)
        return (_Hop(replica, answer, events), held), None

    def _take(
        self, event: bytes, progress: Progress, client_wants_usage: bool, collect: list[dict[str, Any]] | None
    ) -> tuple[bytes | None, str | None, bytes | None]:
        """One event from the replica: the bytes for the client (None: none), why the stream must
        move (None: it need not), and the error event to pass on if it cannot. With ``collect`` (a
        non-streamed request) the chunk goes there instead of into bytes."""
        if not event.startswith(b"data:"):
            return event, None, None  # a comment (keep-alive): as is
        payload = event[5:].strip()
        if payload == b"[DONE]":
            progress.done = True
            return DONE, None, None
        try:
            data = json.loads(payload)
        except ValueError:
            return event, None, None
        if not isinstance(data, dict):
            return event, None, None
        if "error" in data:
            return None, "error", event
        usage = data.get("usage")
        if isinstance(usage, dict):
            progress.usage = usage
        choices = data.get("choices")
        choice = (
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        )
        ids = None
        if choice is not None:
            if choice.get("finish_reason") == "abort":
                return None, "aborted", None  # the replica gave the generation up (drain, shutdown)
            ids = choice.pop("token_ids", None)
            if isinstance(ids, list):
                progress.token_ids += ids
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str):
                progress.emitted_chars += len(text)
            if choice.get("finish_reason"):
                progress.finished = True
        if progress.response_id is None:
            progress.response_id, progress.created = data.get("id"), data.get("created")
        elif "id" in data:
            data["id"], data["created"] = progress.response_id, progress.created
        if collect is not None:
            collect.append(data)
            return b"", None, None
        if usage and not choices and not client_wants_usage:
            return None, None, None  # the usage chunk asked for on the client's behalf
        if not progress.moved and ids is not None:
            # The runtime's compact chunk with its ids cut out: what it would have sent the client.
            stripped, cut = _TOKEN_IDS.subn(b"", event)
            if cut == 1:
                return stripped, None, None
        return (
            b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n",
            None,
            None,
        )

    def _track(self, hop: _Hop) -> None:
        self._hops[id(hop)] = hop
        self._active.setdefault(hop.replica.url, set()).add(id(hop))

    def _untrack(self, hop: _Hop) -> None:
        self._hops.pop(id(hop), None)
        active = self._active.get(hop.replica.url)
        if active is not None:
            active.discard(id(hop))
            if not active:
                del self._active[hop.replica.url]


async def interrupt_route(request: Request) -> Response:
    """``names.GATEWAY_INTERRUPT_PATH`` on the admin port: the replica named leaves rotation and its
    generations move to other replicas now (what a spot or capacity notice calls)."""
    gateway = request.app.state.gateway
    try:
        data = json.loads(await request.body())
    except ValueError:
        data = None
    url = data.get("replica") if isinstance(data, dict) else None
    if not isinstance(url, str):
        return JSONResponse({"error": 'the body must be {"replica": "<base URL>"}'}, status_code=400)
    replicas = [r for pool in gateway.pools.by_model.values() for r in pool.replicas if r.url == url]
    if not replicas:
        known = sorted(r.url for pool in gateway.pools.by_model.values() for r in pool.replicas)
        return JSONResponse(
            {"error": f"replica {url!r} is not one of this gateway's: {known}"}, status_code=404
        )
    for replica in replicas:
        replica.mark_down()
    moved = gateway.proxy.migrator.interrupt(url)
    log.warning("replica interrupted", extra={"event": "replica_interrupted", "replica": url, "moved": moved})
    return JSONResponse({"replica": url, "moved": moved})


def _error_event(error: GatewayError) -> bytes:
    body = {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}
    return f"data: {json.dumps(body)}\n\n".encode()


def _limit_event(limit: int, attempts: int, why: str, reason: str) -> bytes:
    if reason == "limit":
        message = (
            f"the replica serving this stream failed ({why}) and the request's migration limit "
            f"({limit}) is reached after {attempts} attempts at other replicas"
        )
        code = "migration_limit"
    else:
        message = f"the replica serving this stream failed ({why}) and no other replica could continue it"
        code = "upstream_failed"
    error = error_body(message, 502, code=code)
    return f"data: {json.dumps(error)}\n\n".encode()


async def _finish(events: AsyncIterator[list[bytes]]) -> None:
    """Read a finished generation's answer to its end (what follows ``[DONE]``: the chunked body's
    last chunk), so its connection goes back to the pool rather than closed; a replica that holds
    the answer open after it is not waited for."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(FINISH_WAIT_S):
            async for _ in events:
                pass


def assemble(chunks: list[dict[str, Any]], tail: bytes) -> tuple[int, dict[str, Any]]:
    """The non-streamed answer (status, body) built from a relayed stream's chunks: their text and
    logprobs joined, the finish reason and usage of its end; an error event's body with its
    status when the stream ended in one (``tail``: the relay's bytes, which hold only that)."""
    for event in tail.split(b"\n\n"):
        if event.startswith(b"data:") and event[5:].strip() not in (b"", b"[DONE]"):
            chunks = [*chunks, json.loads(event[5:])]
    text: list[str] = []
    chat = False
    first: dict[str, Any] | None = None
    finish: str | None = None
    usage: dict[str, Any] | None = None
    content_logprobs: list[Any] = []
    completion_logprobs: dict[str, list[Any]] = {}
    any_logprobs = False
    for data in chunks:
        if "error" in data:
            code = (data.get("error") or {}).get("code")
            return (503 if code in UNAVAILABLE else 502), data
        first = first or data
        if isinstance(data.get("usage"), dict):
            usage = data["usage"]
        for choice in data.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict):
                chat = True
                text.append(delta.get("content") or "")
            else:
                text.append(choice.get("text") or "")
            finish = choice.get("finish_reason") or finish
            lp = choice.get("logprobs")
            if isinstance(lp, dict):
                any_logprobs = True
                content_logprobs += lp.get("content") or []
                for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    completion_logprobs.setdefault(key, []).extend(lp.get(key) or [])
    first = first or {}
    joined = "".join(text)
    logprobs: dict[str, Any] | None = None
    if any_logprobs:
        logprobs = {"content": content_logprobs} if chat else completion_logprobs
    if chat:
        choice_out: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": joined}}
    else:
        choice_out = {"index": 0, "text": joined}
    choice_out["logprobs"] = logprobs
    choice_out["finish_reason"] = finish
    body: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion" if chat else "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
    }
    # What else the replica put on its chunks (system_fingerprint, …) stays on the answer.
    body.update({k: v for k, v in first.items() if k not in ("object", "choices", "usage")})
    body["choices"] = [choice_out]
    if usage is not None:
        body["usage"] = usage
    return 200, body
