"""Prefill/decode disaggregation: a prefill replica's KV blocks handed to a decode replica over TCP.

The requests and answers speak vLLM's ``kv_transfer_params`` (:class:`KvTransferParams`): the
prefill replica runs a prompt sent with ``do_remote_decode``, keeps the blocks holding its full
blocks under a **lease** (an extra reference in the block manager, dropped when a decode replica
claims them or when ``lease_s`` passes), and answers with its engine id, host, port, the request
id the lease is under and the block ids. A decode replica given those with ``do_remote_prefill``
looks the prompt up in its own prefix cache first, **pulls** only the blocks it lacks into blocks
it reserves in its own paged cache, registers them under their chained hashes (so later requests
hit them), and schedules the request: the scheduler finds the whole pulled prefix cached and
computes only the prompt's tail (the last partial block and the last token, whose logits give the
first token), as vLLM's decode side recomputes the last prompt token.

The wire (one TCP connection per pull, to the prefill's ``kv_transfer.port``)::

    decode -> prefill   one JSON line: engine_id, request_id, block_ids, tokens_digest, layout
    prefill -> decode   one JSON line: {"ok": true} or {"ok": false, "error": "..."}
                        then per block, in order: ">QI" (block id, payload length), the payload
                        (each layer's K then V rows of that block, as the cache holds them), and
                        the payload's 16-byte BLAKE2b digest
    decode -> prefill   b"claimed\\n" once every block is checked and written: the lease ends

Blocks go one at a time straight from the prefill's cache to the decode's (no copy of either
cache); a digest that does not match, a layout that differs, a closed connection or a stall of
``timeout_s`` fails the pull, and ``on_failure`` decides: ``recompute`` (the decode replica runs
the prompt itself) or ``fail`` (the request ends with a :class:`KvTransferError` naming the
prefill replica and how far the pull got).

Threads: the listener and each pull run on threads of their own and touch only blocks nobody
else writes (leased ones, reserved ones); everything the block manager or the scheduler sees
changes on the engine's thread, in :meth:`KvTransfer.tend`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from frontier_runtime.config import KvTransferConfig
from frontier_runtime.engine.api import KvTransferError
from frontier_runtime.engine.block_manager import BlockManager
from frontier_runtime.engine.sequence import Sequence, Status
from frontier_runtime.requests import KvTransferParams

log = logging.getLogger("frontier_runtime.engine.kv_transfer")

_BLOCK_HEADER = struct.Struct(">QI")
_DIGEST_BYTES = 16
_CLAIMED = b"claimed\n"
_MAX_LINE = 16 * 1024 * 1024

KvCaches = list[tuple[torch.Tensor, torch.Tensor]]


def tokens_digest(token_ids: Seq[int]) -> str:
    """What both sides compare before a block moves: the leased tokens are the decode's prompt's."""
    return hashlib.blake2b(struct.pack(f">{len(token_ids)}I", *token_ids), digest_size=16).hexdigest()


def cache_layout(kv_caches: KvCaches) -> list[list[object]]:
    """One block's shape and dtype in each layer's K and V cache: both sides must hold the same."""
    return [[list(k.shape[1:]), str(k.dtype), list(v.shape[1:]), str(v.dtype)] for k, v in kv_caches]


def read_block(kv_caches: KvCaches, block: int) -> bytes:
    parts = []
    for k, v in kv_caches:
        parts.append(k[block].contiguous().view(torch.uint8).numpy().tobytes())
        parts.append(v[block].contiguous().view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def write_block(kv_caches: KvCaches, block: int, payload: bytes) -> None:
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    offset = 0
    for k, v in kv_caches:
        for cache in (k, v):
            dest = cache[block]
            n = dest.numel() * dest.element_size()
            dest.copy_(raw[offset : offset + n].view(dest.dtype).view(dest.shape))
            offset += n
    if offset != len(payload):
        raise KvTransferError(
            f"a block of {len(payload)} bytes does not fill this cache's {offset}-byte block"
        )


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_DIGEST_BYTES).digest()


# -- the prefill side ------------------------------------------------------------------------------


@dataclass
class Lease:
    blocks: list[int]
    digest: str
    expires: float


class LeaseTable:
    """Leased blocks by request id; the listener's threads look them up and claim them, the
    engine's thread takes what is claimed or expired and drops the references."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._claimed: deque[str] = deque()

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)

    def hold(self, request_id: str, lease: Lease) -> Lease | None:
        """Lease blocks under ``request_id``; returns the lease it replaces (drop its references)."""
        with self._lock:
            old = self._leases.get(request_id)
            self._leases[request_id] = lease
            return old

    def get(self, request_id: str) -> Lease | None:
        with self._lock:
            return self._leases.get(request_id)

    def claim(self, request_id: str) -> None:
        with self._lock:
            self._claimed.append(request_id)

    def take_ended(self, now: float) -> list[Lease]:
        """Leases claimed since the last call, or past their expiry: their blocks to unreference."""
        ended = []
        with self._lock:
            while self._claimed:
                lease = self._leases.pop(self._claimed.popleft(), None)
                if lease is not None:
                    ended.append(lease)
            for rid in [rid for rid, lease in self._leases.items() if lease.expires <= now]:
                ended.append(self._leases.pop(rid))
        return ended


class TransferServer:
    """The prefill replica's listener: streams leased blocks to the decode replicas that ask."""

    def __init__(self, engine_id: str, leases: LeaseTable, kv_caches: KvCaches, host: str, port: int) -> None:
        self.engine_id = engine_id
        self.leases = leases
        self.kv_caches = kv_caches
        self.layout = cache_layout(kv_caches)
        try:
            self._sock = socket.create_server((host, port), reuse_port=False)
        except OSError as exc:
            raise OSError(f"kv_transfer.port {port}: cannot listen on {host or '*'}:{port}: {exc}") from exc
        self.port = self._sock.getsockname()[1]
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="frontier-kv-transfer", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="frontier-kv-send", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            try:
                ask = json.loads(reader.readline(_MAX_LINE))
                problem, lease = self._check(ask)
                if problem:
                    conn.sendall(json.dumps({"ok": False, "error": problem}).encode() + b"\n")
                    return
                assert lease is not None
                conn.sendall(b'{"ok": true}\n')
                for block in ask["block_ids"]:
                    payload = read_block(self.kv_caches, block)
                    conn.sendall(_BLOCK_HEADER.pack(block, len(payload)) + payload + _digest(payload))
                if reader.readline(len(_CLAIMED)) == _CLAIMED:
                    self.leases.claim(ask["request_id"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("a KV pull ended early: %s", exc)

    def _check(self, ask: dict[str, object]) -> tuple[str, Lease | None]:
        if ask.get("engine_id") != self.engine_id:
            return f"engine {ask.get('engine_id')!r} is not this one ({self.engine_id})", None
        rid = ask.get("request_id")
        lease = self.leases.get(str(rid))
        if lease is None:
            return f"no lease for request {rid!r} (claimed already, expired, or never leased)", None
        if ask.get("tokens_digest") != lease.digest:
            return f"request {rid!r}: the prompt's tokens differ from the leased ones", None
        wanted = ask.get("block_ids")
        if not isinstance(wanted, list) or not set(wanted) <= set(lease.blocks):
            return f"request {rid!r}: block ids {wanted} are not among the leased {lease.blocks}", None
        if ask.get("layout") != self.layout:
            return f"the caches' block layouts differ: {ask.get('layout')} here is {self.layout}", None
        return "", lease

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


# -- the decode side -------------------------------------------------------------------------------


def pull_blocks(
    params: KvTransferParams,
    remote_ids: list[int],
    digest: str,
    kv_caches: KvCaches,
    local_ids: list[int],
    timeout_s: float,
    progress: list[int],
) -> None:
    """Stream ``remote_ids`` from the prefill replica into ``local_ids``, checking each block's
    digest; ``progress[0]`` counts the blocks written. Raises KvTransferError."""
    where = f"prefill replica {params.remote_host}:{params.remote_port} (engine {params.remote_engine_id})"
    ask = {
        "engine_id": params.remote_engine_id,
        "request_id": params.remote_request_id,
        "block_ids": remote_ids,
        "tokens_digest": digest,
        "layout": cache_layout(kv_caches),
    }
    try:
        with socket.create_connection(
            (str(params.remote_host), int(params.remote_port or 0)), timeout_s
        ) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(json.dumps(ask).encode() + b"\n")
            with conn.makefile("rb") as reader:
                answer = json.loads(reader.readline(_MAX_LINE) or b"null")
                if not isinstance(answer, dict) or not answer.get("ok"):
                    why = answer.get("error") if isinstance(answer, dict) else "the connection closed"
                    raise KvTransferError(f"{where} refused the pull: {why}")
                for want, local in zip(remote_ids, local_ids, strict=True):
                    head = reader.read(_BLOCK_HEADER.size)
                    if len(head) < _BLOCK_HEADER.size:
                        raise KvTransferError(
                            f"{where} closed the connection after {progress[0]} of {len(remote_ids)} blocks"
                        )
                    block, size = _BLOCK_HEADER.unpack(head)
                    body = reader.read(size + _DIGEST_BYTES)
                    if len(body) < size + _DIGEST_BYTES:
                        raise KvTransferError(
                            f"{where} closed the connection in block {progress[0] + 1} of {len(remote_ids)}"
                        )
                    payload, got = body[:size], body[size:]
                    if block != want or _digest(payload) != got:
                        raise KvTransferError(
                            f"{where}: block {progress[0] + 1} of {len(remote_ids)} (remote id {block}) "
                            "failed its checksum"
                        )
                    write_block(kv_caches, local, payload)
                    progress[0] += 1
            conn.sendall(_CLAIMED)
    except TimeoutError:
        raise KvTransferError(
            f"{where} stalled over {timeout_s} s after {progress[0]} of {len(remote_ids)} blocks"
        ) from None
    except (OSError, ValueError) as exc:
        raise KvTransferError(
            f"{where} failed after {progress[0]} of {len(remote_ids)} blocks: {type(exc).__name__}: {exc}"
        ) from None


@dataclass
class _Pull:
    seq: Sequence
    held: list[int]  # every block this pull holds a reference to: local hits and reserved blocks
    thread: threading.Thread | None = None
    error: KvTransferError | None = None
    progress: list[int] = field(default_factory=lambda: [0])
    done: bool = False
    cancelled: bool = False


@dataclass
class Tended:
    """What :meth:`KvTransfer.tend` hands the engine: requests to schedule and requests that failed."""

    ready: list[Sequence] = field(default_factory=list)
    failed: list[tuple[Sequence, KvTransferError]] = field(default_factory=list)


class KvTransfer:
    """One engine's side of disaggregation: its leases (prefill) or its pulls (decode)."""

    def __init__(
        self, config: KvTransferConfig, blocks: BlockManager, kv_caches: KvCaches, ranks: int
    ) -> None:
        if config.role != "both" and ranks > 1:
            raise ValueError(
                f"kv_transfer.role {config.role!r} needs a replica of one rank, this one has {ranks}"
            )
        if config.role == "decode" and not blocks.enable_prefix_caching:
            raise ValueError(
                "kv_transfer.role 'decode' needs prefix_caching: pulled blocks enter it by their hashes"
            )
        self.config = config
        self.role = config.role
        self.blocks = blocks
        self.kv_caches = kv_caches
        self.engine_id = uuid.uuid4().hex
        self.leases = LeaseTable()
        self.server: TransferServer | None = None
        if self.role == "prefill":
            self.server = TransferServer(self.engine_id, self.leases, kv_caches, config.host, config.port)
        self.host = config.host or socket.gethostname()
        self._pulls: dict[str, _Pull] = {}
        self._admitting: list[_Pull] = []  # pulled, scheduled, holding their blocks until admitted
        self._wake = threading.Event()
        self.blocks_pulled = 0
        self.pulls_failed = 0
        self.leases_expired = 0

    # -- requests -------------------------------------------------------------------------------

    def check(self, params: KvTransferParams | None) -> None:
        """Refuse a request this replica's role cannot serve (ValueError naming the role)."""
        if params is None:
            return
        if params.do_remote_decode and self.role != "prefill":
            raise ValueError(
                f"kv_transfer_params.do_remote_decode needs a replica of kv_transfer.role 'prefill', "
                f"this one is {self.role!r}"
            )
        if params.do_remote_prefill and self.role != "decode":
            raise ValueError(
                f"kv_transfer_params.do_remote_prefill needs a replica of kv_transfer.role 'decode', "
                f"this one is {self.role!r}"
            )

    @property
    def busy(self) -> bool:
        return bool(self._pulls)

    def lease(self, seq: Sequence) -> KvTransferParams | None:
        """A prefill that finished: lease the blocks of its prompt that a decode needs (every full
        block before the last prompt token) and say where they are. Engine thread."""
        params = seq.params.kv_transfer
        if params is None or not params.do_remote_decode or seq.finish_reason == "abort":
            return None
        bs = self.blocks.block_size
        n = min((seq.num_prompt_tokens - 1) // bs, seq.num_computed_tokens // bs, len(seq.block_table))
        if seq.num_released_blocks:  # a sliding window freed its leading blocks: the decode computes it all
            n = 0
        leased = list(seq.block_table[:n])
        self.blocks.hold(leased)
        old = self.leases.hold(
            seq.request_id,
            Lease(leased, tokens_digest(seq.token_ids[: n * bs]), time.monotonic() + self.config.lease_s),
        )
        if old is not None:
            self.blocks.unhold(old.blocks)
        return KvTransferParams(
            do_remote_prefill=True,
            remote_engine_id=self.engine_id,
            remote_request_id=seq.request_id,
            remote_host=self.host,
            remote_port=self.server.port if self.server is not None else self.config.port,
            remote_block_ids=tuple(leased),
        )

    def start_pull(self, seq: Sequence) -> bool:
        """A decode request: hold what the local prefix cache has, reserve blocks for the rest and
        start pulling them. False: nothing to pull (or no room), schedule it as it is. Engine thread."""
        params = seq.params.kv_transfer
        if params is None or not params.do_remote_prefill:
            return False
        bs = self.blocks.block_size
        usable = min(len(params.remote_block_ids), (seq.num_prompt_tokens - 1) // bs)
        hits = self.blocks.find_cached_prefix(seq)[:usable]
        if len(hits) >= usable:
            return False  # the local prefix cache holds all of it: nothing to move
        self.blocks.hold(hits)  # first: a cached hit on the free list must not be reserved over
        reserved = self.blocks.reserve(usable - len(hits))
        if reserved is None:
            self.blocks.unhold(hits)
            log.warning("no free KV blocks to pull %s's prefix into: computing it here", seq.request_id)
            return False
        pull = _Pull(seq, hits + reserved)
        remote = list(params.remote_block_ids[len(hits) : usable])
        digest = tokens_digest(seq.token_ids[: usable * bs])
        pull.thread = threading.Thread(
            target=self._run_pull,
            args=(pull, params, remote, digest, reserved),
            name=f"frontier-kv-pull-{seq.request_id}",
            daemon=True,
        )
        self._pulls[seq.request_id] = pull
        pull.thread.start()
        return True

    def _run_pull(
        self, pull: _Pull, params: KvTransferParams, remote: list[int], digest: str, local: list[int]
    ) -> None:
        try:
            pull_blocks(params, remote, digest, self.kv_caches, local, self.config.timeout_s, pull.progress)
        except KvTransferError as exc:
            pull.error = exc
        except Exception as exc:  # noqa: BLE001 - any failure is the pull's, handled by policy
            pull.error = KvTransferError(f"the KV pull failed: {type(exc).__name__}: {exc}")
        finally:
            pull.done = True
            self._wake.set()

    def cancel(self, request_id: str) -> bool:
        """An aborted request: its pull's blocks are released once the pull thread is done."""
        pull = self._pulls.get(request_id)
        if pull is None:
            return False
        pull.cancelled = True
        return True

    def wait(self, timeout_s: float) -> None:
        """Block the idle engine thread until a pull ends (instead of spinning empty steps)."""
        if self._wake.wait(timeout_s):
            self._wake.clear()

    # -- the engine thread, each step -----------------------------------------------------------

    def end_leases(self) -> int:
        """Drop the blocks of leases claimed or expired; how many ended."""
        now = time.monotonic()
        ended = self.leases.take_ended(now)
        for lease in ended:
            if lease.expires <= now:
                self.leases_expired += 1
            self.blocks.unhold(lease.blocks)
        return len(ended)

    def tend(self) -> Tended:
        out = Tended()
        self.end_leases()
        still = []
        for pull in self._admitting:  # released once the scheduler holds the blocks itself
            if pull.seq.status is Status.WAITING:
                still.append(pull)
            else:
                self.blocks.unhold(pull.held)
        self._admitting = still
        for rid, pull in list(self._pulls.items()):
            if not pull.done:
                continue
            del self._pulls[rid]
            if pull.cancelled:
                self.blocks.unhold(pull.held)
            elif pull.error is None:
                self.blocks.register(pull.seq.token_ids, pull.held)
                self.blocks_pulled += pull.progress[0]
                self._admitting.append(pull)
                out.ready.append(pull.seq)
            else:
                self.pulls_failed += 1
                self.blocks.unhold(pull.held)
                if self.config.on_failure == "recompute":
                    log.warning("%s; recomputing the prompt here", pull.error)
                    out.ready.append(pull.seq)
                else:
                    out.failed.append((pull.seq, pull.error))
        return out

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
