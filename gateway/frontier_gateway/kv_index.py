"""KV-cache-aware routing: which replica holds the longest cached prefix of a request, learned from
the replicas' own KV events, blended with the load this gateway knows.

Each replica of a pool with ``kv_routing`` publishes its prefix cache's changes in vLLM's KV-event
format (the runtime's ``runtime.kv_events``, or vLLM's ``--kv-events-config``): ZMQ PUB frames
``topic, seq (8 bytes big-endian), msgpack KVEventBatch`` and a ROUTER socket that replays from a
sequence. ``KvIndex`` keeps block key -> replicas from them:

- **Keys are the gateway's own.** A ``BlockStored`` carries its token ids and its parent's engine
  hash; the index chains its own key over each block's tokens (``block_hashes``: Python's tuple
  hash, the runtime's own scheme) and maps the engine's hashes to it, so a ``BlockRemoved`` finds
  its key and an engine with another hash (vLLM's sha256) is indexed the same way.
- **A request is hashed the same way**: its chat messages rendered with the model's chat template
  and encoded with its tokenizer (``PromptTokens``: the whole conversation, not the first message),
  full blocks only, at most ``n - 1`` tokens (the engine never takes a whole prompt from its cache).
- **Score**: the longest run of the request's leading blocks a replica holds. The chosen replica
  minimises ``blocks to prefill + load_weight_blocks x requests in flight`` (its in-flight count
  is the gateway's own, known at dispatch: no scrape lags it), as Dynamo's KV router costs prefill
  and decode work. Equal costs go to the one with fewer in flight, then to the one that took
  fewer of the recent decisions, then in turn (never the first listed: a shared system prompt ties
  every replica, and the first would take every conversation).
- **Share cap**: a replica that took ``share_cap / replicas`` or more of the pool's last
  ``SHARE_WINDOW`` (32) decisions is passed over while another is under it, whatever it holds. At low
  concurrency the in-flight count is 0 or 1 everywhere and cannot spread anything: the first
  replica to hold the shared system prompt would win every new conversation (it alone skips that
  prefill), its speculative entries would make it win the next, and one replica's cache would end
  up holding every conversation while the others idle. The cap spreads the conversations; their
  hits keep each one on the replica it was spread to.
- **Queue depth** is the gateway's own in-flight count, not a figure the runtime reports: every
  request queued at a replica went through the gateway that counts it, so at dispatch the count is
  exact, where a reported depth (a scrape, a probe's header) lags by its interval — the overshoot of
  llm-d-router #2066. Several gateways each see their own share; a field in the event batch would
  break vLLM's ``KVEventBatch`` layout that other consumers decode.
- **Speculative entries**: the request's blocks count as held by the chosen replica for
  ``speculative_ttl_s``, until its events arrive (a burst sharing a prefix follows the first one).
- **Gaps**: a sequence number skipped asks the replica's replay socket for the missing batches; if
  the replay cannot give them all, the replica's entries are dropped (stale entries would route to
  blocks long evicted) and the index rebuilds from the events that follow.
- **Membership**: a replica that leaves the pool takes its entries and its subscription with it.
- **Events stopped**: a replica sent a request whose blocks it did not hold (so it must announce
  them) and nothing has come from it for ``stale_after_s``: its entries no longer count. When no
  replica of a decision has live events, the pool routes by load alone; every decision is counted
  by outcome (``frontier_gateway_kv_routing{model, outcome}``).
- **The tokenizer**: a pool's ``tokenizer_source`` (its weights version in S3) gives the two files
  the gateway fetches at start into a directory of its own. A fetch that fails, or files that will
  not load, leave that pool routed by load alone, every decision counted as ``no_tokenizer``: the
  pool keeps taking requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("frontier_gateway.kv_index")

END_OF_REPLAY = -1
SHARE_WINDOW = 32  # the decisions the share cap counts: a few per conversation of a busy pool

# Decision outcomes, the label of the routing metric.
KV_HIT = "kv_hit"  # a replica held part of the prompt and took the request
KV_MISS = "kv_miss"  # no live replica held any of it: the least-cost (least loaded) one took it
EVENTS_STOPPED = "events_stopped"  # no candidate had live events: load only
NO_TOKENS = "no_tokens"  # the request could not be tokenized: load only
NO_TOKENIZER = "no_tokenizer"  # the pool's tokenizer could not be had at start: load only
# The files the gateway tokenizes with, which it fetches from a pool's tokenizer_source.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def block_hashes(token_ids: Sequence[int], block_size: int, limit: int | None = None) -> list[int]:
    """Chained keys of the full blocks of ``token_ids`` (the runtime's block manager's own hashes)."""
    keys: list[int] = []
    parent: int | None = None
    full = len(token_ids) // block_size
    if limit is not None:
        full = min(full, limit)
    for i in range(full):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        keys.append(parent)
    return keys


def request_blocks(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The keys a request can hit: full blocks of its first ``n - 1`` tokens."""
    return block_hashes(token_ids, block_size, limit=(len(token_ids) - 1) // block_size)


# -- decoding vLLM's batches ---------------------------------------------------------------------


def decode_batch(payload: bytes) -> list[list[Any]]:
    """The events of one KVEventBatch, each as ``[tag, *fields]``: array-like structs (vLLM's
    layout, and the runtime's) or maps with a ``type`` tag (vLLM builds without ``array_like``)."""
    import msgpack  # type: ignore[import-untyped]

    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    events = batch.get("events", []) if isinstance(batch, dict) else batch[1]
    out: list[list[Any]] = []
    for event in events:
        if isinstance(event, dict):
            tag = event.get("type")
            if tag == "BlockStored":
                out.append(
                    [
                        tag,
                        event.get("block_hashes", []),
                        event.get("parent_block_hash"),
                        event.get("token_ids", []),
                        event.get("block_size", 0),
                    ]
                )
            elif tag == "BlockRemoved":
                out.append([tag, event.get("block_hashes", [])])
            elif tag == "AllBlocksCleared":
                out.append([tag])
        elif isinstance(event, list) and event:
            out.append(event)
    return out


def _key(h: Any) -> Any:
    """An engine hash as a dict key (msgpack gives bytes or int; lists would not hash)."""
    return tuple(h) if isinstance(h, list) else h


# -- the index -----------------------------------------------------------------------------------


@dataclass
class ReplicaEvents:
    url: str
    last_seq: int | None = None
    engine_to_key: dict[Any, int] = field(default_factory=dict)
    last_event_at: float = 0.0
    owed_since: float | None = None  # sent blocks it did not hold, and no event since
    gaps: int = 0
    drops: int = 0
    task: asyncio.Task[None] | None = None


class KvIndex:
    def __init__(
        self,
        block_size: int = 16,
        speculative_ttl_s: float = 2.0,
        stale_after_s: float = 15.0,
        load_weight_blocks: float = 8.0,
        clock: Callable[[], float] = time.monotonic,
        share_cap: float = 1.25,
    ) -> None:
        self.block_size = block_size
        self.share_cap = share_cap
        self._turn = 0
        self.recent: deque[str] = deque(maxlen=SHARE_WINDOW)  # the replicas the last decisions chose
        self.speculative_ttl_s = speculative_ttl_s
        self.stale_after_s = stale_after_s
        self.load_weight_blocks = load_weight_blocks
        self.clock = clock
        self.replicas: dict[str, ReplicaEvents] = {}
        self.where: dict[int, set[str]] = {}  # block key -> replicas holding it (from events)
        self.speculative: dict[tuple[int, str], float] = {}  # (key, replica) -> expiry
        self.outcomes: Counter[str] = Counter()

    # -- membership ----------------------------------------------------------------------------

    def add_replica(self, url: str) -> ReplicaEvents:
        state = self.replicas.get(url)
        if state is None:
            state = self.replicas[url] = ReplicaEvents(url, last_event_at=self.clock())
        return state

    def remove_replica(self, url: str) -> None:
        state = self.replicas.pop(url, None)
        if state is None:
            return
        if state.task is not None:
            state.task.cancel()
        self._drop_entries(url, state)
        for k in [k for k in self.speculative if k[1] == url]:
            del self.speculative[k]

    def _drop_entries(self, url: str, state: ReplicaEvents) -> None:
        for key in state.engine_to_key.values():
            holders = self.where.get(key)
            if holders is not None:
                holders.discard(url)
                if not holders:
                    del self.where[key]
        state.engine_to_key.clear()

    def drop(self, url: str) -> None:
        """Forget what ``url`` holds (a gap that no replay closed)."""
        state = self.replicas.get(url)
        if state is not None:
            state.drops += 1
            self._drop_entries(url, state)

    # -- events --------------------------------------------------------------------------------

    def apply(self, url: str, events: Iterable[list[Any]]) -> None:
        state = self.replicas.get(url)
        if state is None:
            return
        state.last_event_at = self.clock()
        state.owed_since = None
        for event in events:
            tag = event[0]
            if tag == "BlockStored":
                self._stored(url, state, event[1], event[2], event[3], int(event[4]))
            elif tag == "BlockRemoved":
                for h in event[1]:
                    key = state.engine_to_key.pop(_key(h), None)
                    if key is not None:
                        holders = self.where.get(key)
                        if holders is not None:
                            holders.discard(url)
                            if not holders:
                                del self.where[key]
            elif tag == "AllBlocksCleared":
                self._drop_entries(url, state)

    def _stored(
        self,
        url: str,
        state: ReplicaEvents,
        hashes: list[Any],
        parent: Any,
        token_ids: list[int],
        block_size: int,
    ) -> None:
        if parent is None:
            parent_key: int | None = None
        else:
            parent_key = state.engine_to_key.get(_key(parent))
            if parent_key is None:  # its parent was never seen: the chain cannot be keyed
                return
        bs = block_size or self.block_size
        for i, h in enumerate(hashes):
            chunk = token_ids[i * bs : (i + 1) * bs]
            if len(chunk) < bs:
                return
            parent_key = hash((parent_key, tuple(chunk)))
            state.engine_to_key[_key(h)] = parent_key
            self.where.setdefault(parent_key, set()).add(url)
            self.speculative.pop((parent_key, url), None)

    def accept(self, url: str, seq: int) -> str:
        """What to do with batch ``seq`` from ``url``: "apply", "skip" (seen) or "gap"."""
        state = self.replicas.get(url)
        if state is None:
            return "skip"
        if state.last_seq is None:
            return "gap" if seq > 0 else "apply"
        if seq <= state.last_seq:
            return "skip"
        return "gap" if seq > state.last_seq + 1 else "apply"

    def ingest(self, url: str, seq: int, payload: bytes) -> None:
        state = self.replicas.get(url)
        if state is None:
            return
        self.apply(url, decode_batch(payload))
        state.last_seq = seq

    # -- decisions -----------------------------------------------------------------------------

    def live(self, url: str) -> bool:
        state = self.replicas.get(url)
        if state is None:
            return False
        return state.owed_since is None or self.clock() - state.owed_since <= self.stale_after_s

    def matched(self, url: str, keys: Sequence[int], now: float | None = None) -> int:
        """Leading blocks of ``keys`` that ``url`` holds (from its events, or speculatively)."""
        now = self.clock() if now is None else now
        n = 0
        for key in keys:
            holders = self.where.get(key)
            if holders is None or url not in holders:
                expiry = self.speculative.get((key, url))
                if expiry is None or expiry < now:
                    break
            n += 1
        return n

    def choose(
        self, candidates: Sequence[Any], keys: Sequence[int] | None, without_keys: str = NO_TOKENS
    ) -> tuple[Any, str]:
        """The candidate (anything with ``url`` and ``outstanding``) of least cost, and the outcome
        (``without_keys``: the outcome a decision without keys counts as)."""
        now = self.clock()
        if keys is None:
            outcome = without_keys
            matches = dict.fromkeys((c.url for c in candidates), 0)
        else:
            live = [c for c in candidates if self.live(c.url)]
            outcome = KV_MISS if live else EVENTS_STOPPED
            matches = {c.url: self.matched(c.url, keys, now) if c in live else 0 for c in candidates}
        total = len(keys or ())
        w = self.load_weight_blocks
        cap = self.share_cap * SHARE_WINDOW / len(candidates)
        taken = Counter(self.recent)
        under = [c for c in candidates if taken[c.url] < cap or not taken[c.url]] or list(candidates)
        costs = {c.url: (total - matches[c.url]) + w * c.outstanding for c in under}
        best = min(costs.values())
        tied = [c for c in under if costs[c.url] == best]
        fewest = min((c.outstanding, taken[c.url]) for c in tied)
        tied = [c for c in tied if (c.outstanding, taken[c.url]) == fewest]
        least = tied[self._turn % len(tied)]
        self._turn += 1
        self.recent.append(least.url)
        if matches[least.url]:
            outcome = KV_HIT
        self.outcomes[outcome] += 1
        return least, outcome

    def routed(self, url: str, keys: Sequence[int]) -> None:
        """``url`` takes a request of ``keys``: speculative entries until its events say so, and
        the replica now owes events if it held only part of them."""
        now = self.clock()
        state = self.replicas.get(url)
        if state is None or not keys:
            return
        if self.matched(url, keys, now) < len(keys) and state.owed_since is None:
            state.owed_since = now
        expiry = now + self.speculative_ttl_s
        for key in keys:
            holders = self.where.get(key)
            if holders is None or url not in holders:
                self.speculative[(key, url)] = expiry
        if len(self.speculative) > 4 * (len(self.where) + 1024):
            self.speculative = {k: t for k, t in self.speculative.items() if t >= now}

    def summary(self) -> dict[str, int]:
        return {url: len(s.engine_to_key) for url, s in self.replicas.items()}


# -- subscriptions -------------------------------------------------------------------------------


class KvSubscriber:
    """The index's ZMQ subscriptions, one task per replica, on the gateway's event loop."""

    def __init__(
        self,
        index: KvIndex,
        events_port: int,
        replay_port: int,
        ports: dict[str, tuple[int, int]] | None = None,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.index = index
        self.events_port = events_port
        self.replay_port = replay_port
        self.ports = ports or {}
        self.replay_timeout_s = replay_timeout_s
        self._ctx: Any = None

    def endpoints(self, url: str) -> tuple[str, str]:
        host = urlsplit(url).hostname or "127.0.0.1"
        events, replay = self.ports.get(url, (self.events_port, self.replay_port))
        return f"tcp://{host}:{events}", f"tcp://{host}:{replay}"

    def sync(self, urls: Iterable[str]) -> None:
        """Follow exactly ``urls``: subscribe to new replicas, drop those that left."""
        wanted = set(urls)
        for url in [u for u in self.index.replicas if u not in wanted]:
            self.index.remove_replica(url)
        for url in wanted:
            state = self.index.add_replica(url)
            if state.task is None or state.task.done():
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:
                    continue  # started by start() once the gateway's loop runs
                state.task = loop.create_task(self._follow(url))

    def start(self) -> None:
        self.sync(list(self.index.replicas))

    def close(self) -> None:
        for state in self.index.replicas.values():
            if state.task is not None:
                state.task.cancel()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def _context(self) -> Any:
        if self._ctx is None:
            import zmq.asyncio

            self._ctx = zmq.asyncio.Context()
        return self._ctx

    async def _follow(self, url: str) -> None:
        import zmq

        events, _ = self.endpoints(url)
        sub = self._context().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(events)
        try:
            while url in self.index.replicas:
                frames = await sub.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    continue
                seq = int.from_bytes(frames[1], "big")
                verdict = self.index.accept(url, seq)
                if verdict == "skip":
                    continue
                if verdict == "gap":
                    await self._replay(url, seq)
                    if self.index.accept(url, seq) == "skip":
                        continue
                self.index.ingest(url, seq, frames[2])
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bad stream costs its replica's entries, not the gateway
            log.exception(
                "KV events of a replica failed", extra={"event": "kv_events_failed", "replica": url}
            )
            self.index.drop(url)
        finally:
            sub.close(linger=0)

    async def _replay(self, url: str, upto: int) -> None:
        """Fetch the batches before ``upto`` that the subscription missed, from the replica's replay
        socket. A gap the replay cannot close (batches out of its buffer, no answer) costs the
        replica its entries: removals may be among the lost. A fresh subscription takes what the
        buffer still holds (what it missed before that, it never knew)."""
        import zmq

        state = self.index.replicas.get(url)
        if state is None:
            return
        state.gaps += 1
        fresh = state.last_seq is None
        start = 0 if state.last_seq is None else state.last_seq + 1
        _, replay = self.endpoints(url)
        sock = self._context().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(replay)
        got: list[tuple[int, bytes]] = []
        ended = False
        try:
            await sock.send_multipart((b"", start.to_bytes(8, "big")))
            while await sock.poll(int(self.replay_timeout_s * 1000)):
                frames = await sock.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == END_OF_REPLAY:
                    ended = True
                    break
                if start <= seq < upto:
                    got.append((seq, frames[2]))
        finally:
            sock.close(linger=0)
        got.sort()
        closed = ended and [seq for seq, _ in got] == list(range(start, upto))
        if not closed and not fresh:
            log.warning(
                "KV events gap not replayed: the replica's entries are dropped",
                extra={"event": "kv_events_gap", "replica": url, "from": start, "to": upto},
            )
            self.index.drop(url)
        for seq, payload in got:
            self.index.ingest(url, seq, payload)
        state.last_seq = upto - 1


# -- the request's tokens ------------------------------------------------------------------------


class PromptTokens:
    """A request's prompt token ids as the runtime computes them: the model's ``tokenizer.json``
    and the chat template of its ``tokenizer_config.json`` (the runtime's own rendering)."""

    def __init__(self, model_dir: str | Path) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        model_dir = Path(model_dir)
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}

        def text(value: object) -> str:
            if isinstance(value, dict):
                return str(value.get("content") or "")
            return value if isinstance(value, str) else ""

        self.bos_token = text(cfg.get("bos_token"))
        self.eos_token = text(cfg.get("eos_token"))
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def _raise(message: str) -> None:
            raise ValueError(message)

        env.globals["raise_exception"] = _raise
        source = cfg.get("chat_template")
        self._template = env.from_string(source) if isinstance(source, str) else None

    def for_body(self, body: dict[str, Any]) -> list[int] | None:
        """The prompt ids of a chat or completion body; None when it cannot say (then: load only)."""
        try:
            messages = body.get("messages")
            if isinstance(messages, list):
                if self._template is None:
                    return None
                rendered = self._template.render(
                    messages=[_template_message(m) for m in messages if isinstance(m, dict)],
                    add_generation_prompt=body.get("add_generation_prompt", True),
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                )
                return list(self._tok.encode(rendered, add_special_tokens=False).ids)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
                prompt = prompt[0]
            if isinstance(prompt, str):
                return list(self._tok.encode(prompt, add_special_tokens=True).ids)
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return list(prompt)
        except Exception:  # noqa: BLE001 - a body the template refuses is the runtime's to answer
            return None
        return None


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the runtime hands it to the template: text parts joined into one string."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    out: dict[str, Any] = {"role": message.get("role"), "content": content or ""}
    if message.get("name"):
        out["name"] = message["name"]
    return out


# -- a pool's KV routing -------------------------------------------------------------------------


class KvRouting:
    """What a pool with ``kv_routing`` holds: the index, its subscriptions, the model's tokenizer."""

    def __init__(self, config: Any, urls: Iterable[str] = (), model: str = "") -> None:
        """``config``: the pool's ``KvRoutingConfig``; ``model``: the pool's name, for the log."""
        self.config = config
        self.model = model
        self.index = KvIndex(
            block_size=config.block_size,
            speculative_ttl_s=config.speculative_ttl_s,
            stale_after_s=config.stale_after_s,
            load_weight_blocks=config.load_weight_blocks,
            share_cap=config.share_cap,
        )
        self.subscriber = KvSubscriber(self.index, config.events_port, config.replay_port, dict(config.ports))
        self._tokens: PromptTokens | None = None
        # Why the pool routes by load alone: its tokenizer could not be fetched or read. Never a
        # refusal: its requests still go to the least loaded replica, counted as no_tokenizer.
        self.tokenizer_problem = ""
        self.tokenizer_dir = Path(config.tokenizer_dir) if config.tokenizer_dir else None
        if config.tokenizer_source:
            self.tokenizer_dir = self._fetched(config.tokenizer_source)
        self.subscriber.sync(urls)

    @property
    def without_keys(self) -> str:
        """The outcome a decision without block keys counts as."""
        return NO_TOKENIZER if self.tokenizer_problem else NO_TOKENS

    def keys_for(self, body: dict[str, Any]) -> list[int] | None:
        """The block keys a request can hit; None when its tokens are unknown."""
        tokens = self._prompt_tokens()
        if tokens is None:
            return None
        ids = tokens.for_body(body)
        return None if ids is None else request_blocks(ids, self.index.block_size)

    def _prompt_tokens(self) -> PromptTokens | None:
        if self._tokens is None and not self.tokenizer_problem and self.tokenizer_dir is not None:
            try:
                self._tokens = PromptTokens(self.tokenizer_dir)
            except Exception as exc:  # noqa: BLE001 - a tokenizer that will not load: load only
                self._give_up(f"cannot read the tokenizer in {self.tokenizer_dir}: {exc}")
        return self._tokens

    def _fetched(self, source: str) -> Path | None:
        """The tokenizer files of ``source`` (s3://bucket/prefix) in a fresh local directory, or
        None (and the pool routes by load) when they cannot be fetched."""
        import tempfile

        import boto3
        from botocore.config import Config

        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        folder = Path(tempfile.mkdtemp(prefix="frontier-tokenizer-"))
        # A start must not wait long on S3: a few seconds, then load-only routing.
        client = boto3.client(
            "s3", config=Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 2})
        )
        try:
            for name in TOKENIZER_FILES:
                key = f"{prefix.strip('/')}/{name}".lstrip("/")
                client.download_file(bucket, key, str(folder / name))
        except Exception as exc:  # noqa: BLE001 - any failure to fetch means load-only, never a refusal
            self._give_up(f"cannot fetch the tokenizer from {source}: {exc}")
            return None
        log.info(
            "kv tokenizer fetched",
            extra={"event": "kv_tokenizer_fetched", "model": self.model, "source": source},
        )
        return folder

    def _give_up(self, why: str) -> None:
        self.tokenizer_problem = why
        log.warning(
            "kv routing by load only: no tokenizer",
            extra={"event": "kv_tokenizer_unavailable", "model": self.model, "why": why},
        )
