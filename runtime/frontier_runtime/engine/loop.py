"""``AsyncEngine``: the engine loop in one background thread, streams for asyncio code.

The ``LLMEngine`` is not thread-safe, so exactly one thread (started here) touches it. Everything
else talks to that thread through a locked inbox. Its outputs (token ids) go to a second thread,
the output thread, which detokenizes them, applies stop strings (``OutputProcessor``) and hands
them through ``loop.call_soon_threadsafe`` to one ``asyncio.Queue`` per request: the engine
thread goes on to the next step meanwhile. A stop string found there ends the stream at once and
aborts the request in the engine. ``AsyncEngine`` is the server's ``EngineClient`` (see ``api``).

``window_ms`` (the stack's ``runtime.batch.window_ms``) applies only to an idle engine: the first request that arrives into an idle
engine waits up to the window for companions (or until a full batch is there); requests that
arrive while the engine is busy join the running batch at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from frontier_runtime.config import RuntimeConfig
from frontier_runtime.engine.api import EngineDeadError, EngineStats
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.engine.nodes import ReplicaError
from frontier_runtime.engine.output_processor import OutputProcessor
from frontier_runtime.requests import RequestOutput, SamplingParams
from frontier_runtime.tokenizer import Tokenizer

log = logging.getLogger("frontier_runtime.engine.loop")

T = TypeVar("T")
# What a request's stream queue carries: its outputs, then the error that ended it, if one did.
_Streamed = RequestOutput | BaseException


class _AsyncSink:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[_Streamed] = asyncio.Queue()


class _SyncSink:
    def __init__(self) -> None:
        self.outputs: list[RequestOutput] = []
        self.done = threading.Event()
        self.error: BaseException | None = None


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_poll_s: float = 0.25) -> None:
        self.engine = engine
        self.batch_window_s = engine.config.window_ms / 1000.0
        self.idle_poll_s = idle_poll_s
        self._cv = threading.Condition(threading.Lock())
        # ("add", id, prompt, params), ("abort", id) and ("call", fn, future), for the loop thread.
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._sinks: dict[str, _AsyncSink | _SyncSink] = {}
        self._stats = engine.stats()
        self._stopping = False
        self.error: BaseException | None = None
        self.heartbeat = time.monotonic()
        engine.set_detokenize_inline(False)
        self._text = OutputProcessor(engine.tokenizer)  # the output thread's alone
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._output_thread = threading.Thread(
            target=self._run_outputs, name="frontier-engine-outputs", daemon=True
        )
        self._output_thread.start()
        self._thread = threading.Thread(target=self._run, name="frontier-engine-loop", daemon=True)
        self._thread.start()
        engine.on_replica_lost = self._replica_lost
        if engine.workers.lost is not None:  # lost before this loop listened
            self._replica_lost(engine.workers.lost)

    @classmethod
    def from_config(cls, config: RuntimeConfig, model_dir: str | Path) -> AsyncEngine:
        return cls(LLMEngine.from_config(config, model_dir))

    @property
    def tokenizer(self) -> Tokenizer | None:  # read-only use is thread-safe
        return self.engine.tokenizer

    @property
    def max_seq_len(self) -> int:
        return self.engine.max_seq_len

    @property
    def is_running(self) -> bool:
        return (
            self._thread.is_alive()
            and self.error is None
            and not self._stopping
            and self.replica_lost is None
        )

    @property
    def replica_lost(self) -> str | None:
        return self.engine.workers.lost

    def _replica_lost(self, why: str) -> None:
        """From the watchdog's thread: end every request now (the loop thread may be blocked in a
        collective with the lost rank until the process group's timeout) and wake the loop to stop."""
        self._fail_everything(ReplicaError(why))
        with self._cv:
            self._cv.notify()

    # -- requests (any thread) -----------------------------------------------------------------

    def submit(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request; iterate the result for its outputs. Call from inside an event loop.

        Raises ValueError for a request the engine refuses (before anything is queued) and
        EngineDeadError when the loop no longer runs.
        """
        self.engine.validate_request(prompt_token_ids, params)
        sink = _AsyncSink(asyncio.get_running_loop())
        self._enqueue(request_id, list(prompt_token_ids), params, sink)
        return self._stream(request_id, sink)

    def _enqueue(
        self, request_id: str, prompt: list[int], params: SamplingParams, sink: _AsyncSink | _SyncSink
    ) -> None:
        with self._cv:
            if not self.is_running:
                raise EngineDeadError(self._dead_reason())
            if request_id in self._sinks:
                raise ValueError(f"request id {request_id!r} is already in the engine")
            self._sinks[request_id] = sink
            self._outbox.put(("add", request_id, params.stop, params.continuation))
            self._inbox.append(("add", request_id, prompt, params))
            self._cv.notify()

    async def _stream(self, request_id: str, sink: _AsyncSink) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                item = await sink.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:  # the consumer left early: stop generating for nobody
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort" and its blocks are freed."""
        with self._cv:
            if request_id in self._sinks:
                self._inbox.append(("abort", request_id))
                self._cv.notify()

    def call(self, fn: Callable[[LLMEngine], T]) -> Future[T]:
        """Run ``fn(engine)`` on the loop thread between steps (for inspection in tests and tools)."""
        fut: Future[T] = Future()
        with self._cv:
            if not self.is_running:
                raise EngineDeadError(self._dead_reason())
            self._inbox.append(("call", fn, fut))
            self._cv.notify()
        return fut

    def stats(self) -> EngineStats:
        """As of the last step; ``waiting`` includes requests not yet handed to the engine."""
        with self._cv:
            queued = sum(1 for item in self._inbox if item[0] == "add")
        return replace(self._stats, waiting=self._stats.waiting + queued)

    def warmup(self, timeout_s: float = 600.0) -> float:
        """Run one real request (a forward and a sample) through the loop; returns its seconds."""
        tok = self.engine.tokenizer
        bos = tok.bos_token_id if tok is not None and tok.bos_token_id is not None else 0
        sink = _SyncSink()
        start = time.monotonic()
        self._enqueue(f"__warmup-{id(sink)}", [bos] * 8, SamplingParams(max_tokens=2, temperature=0.0), sink)
        if not sink.done.wait(timeout_s):
            raise TimeoutError(f"engine warm-up did not finish within {timeout_s} s")
        if sink.error is not None:
            raise sink.error
        return time.monotonic() - start

    def shutdown(self, timeout_s: float = 30.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout_s)
        self._outbox.put(None)
        self._output_thread.join(timeout_s)
        self.engine.shutdown()

    def _dead_reason(self) -> str:
        if self.replica_lost is not None:
            return f"the replica lost a rank: {self.replica_lost}"
        if self.error is not None:
            return f"the engine loop failed: {type(self.error).__name__}: {self.error}"
        return "the engine is shut down"

    # -- the loop thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._drain_inbox()
                outputs = self.engine.step()
                for rid, exc in self.engine.take_failed():  # a failed KV pull, policy 'fail'
                    self._deliver_error(rid, exc)
                self._stats = self.engine.stats()
                self.heartbeat = time.monotonic()
                self._dispatch(outputs)
            self._abort_everything()
        except BaseException as exc:  # noqa: BLE001 - the loop must report whatever killed it
            log.exception("engine loop failed")
            self.error = exc
            self._fail_everything(exc)

    def _wait_for_work(self) -> bool:
        """Block while idle; apply the batch window when work arrives into an idle engine."""
        with self._cv:
            was_idle = False
            while not self._stopping and not self._inbox and not self.engine.has_unfinished():
                if self.replica_lost is not None:
                    raise ReplicaError(f"the replica lost a rank: {self.replica_lost}")
                was_idle = True
                self._cv.wait(self.idle_poll_s)
                if self.engine.end_leases():  # a prefill's claimed or expired KV leases, while idle
                    self._stats = self.engine.stats()
                self.heartbeat = time.monotonic()
            if self._stopping:
                return False
            if was_idle and self.batch_window_s > 0:
                deadline = time.monotonic() + self.batch_window_s
                full = self.engine.config.max_batch_size
                while not self._stopping and sum(1 for i in self._inbox if i[0] == "add") < full:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
            return not self._stopping

    def _drain_inbox(self) -> None:
        with self._cv:
            items = list(self._inbox)
            self._inbox.clear()
        for item in items:
            kind = item[0]
            if kind == "add":
                _, rid, prompt, params = item
                try:
                    self.engine.add_request(rid, prompt, params)
                except ValueError as exc:
                    self._deliver_error(rid, exc)
            elif kind == "abort":
                self.engine.abort(item[1])
            else:
                _, fn, fut = item
                try:
                    fut.set_result(fn(self.engine))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        if outputs:
            self._outbox.put(("outputs", outputs))

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:
        self._outbox.put(("error", request_id, exc))

    # -- the output thread ----------------------------------------------------------------------

    def _run_outputs(self) -> None:
        """Text, stop strings and delivery, in the order the engine thread queued them."""
        while (item := self._outbox.get()) is not None:
            kind = item[0]
            try:
                if kind == "add":
                    self._text.add(item[1], item[2], item[3])
                elif kind == "outputs":
                    self._hand_over([self._with_text(out) for out in item[1]])
                else:
                    self._deliver_error_now(item[1], item[2])
            except Exception as exc:  # noqa: BLE001 - a request's stream must end, not hang
                log.exception("output thread failed on a %s item", kind)
                for rid in [out.request_id for out in item[1]] if kind == "outputs" else [item[1]]:
                    self._deliver_error_now(rid, exc)

    def _with_text(self, out: RequestOutput) -> RequestOutput:
        processed = self._text.process(out)
        if processed.stopped_by_text:  # the engine may already be a step or two further
            with self._cv:
                self._inbox.append(("abort", out.request_id))
                self._cv.notify()
        return processed.output

    def _hand_over(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[_Streamed], RequestOutput]]] = {}
        with self._cv:
            for out in outputs:
                sink = self._sinks.get(out.request_id)
                if sink is None:  # ended already (a stop string, an error): later tokens are dropped
                    continue
                if out.finished:
                    del self._sinks[out.request_id]
                if isinstance(sink, _SyncSink):
                    sink.outputs.append(out)
                    if out.finished:
                        sink.done.set()
                else:
                    by_loop.setdefault(sink.loop, []).append((sink.queue, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # that event loop is closed: nobody will read these
                for _, out in items:
                    if not out.finished:
                        self.abort(out.request_id)

    def _deliver_error_now(self, request_id: str, exc: BaseException) -> None:
        self._text.discard(request_id)
        with self._cv:
            sink = self._sinks.pop(request_id, None)
        if isinstance(sink, _SyncSink):
            sink.error = exc
            sink.done.set()
        elif sink is not None:
            with contextlib.suppress(RuntimeError):  # that event loop is closed
                sink.loop.call_soon_threadsafe(sink.queue.put_nowait, exc)

    def _abort_everything(self) -> None:
        self._drain_inbox()
        self.engine.abort_all()
        self._dispatch(self.engine.step() if self.engine.has_unfinished() else [])
        with self._cv:
            leftover = list(self._sinks)
        for rid in leftover:
            self._deliver_error(rid, EngineDeadError(self._dead_reason()))

    def _fail_everything(self, exc: BaseException) -> None:
        with self._cv:
            leftover = list(self._sinks)
            calls = [item[2] for item in self._inbox if item[0] == "call"]
            self._inbox.clear()
        for fut in calls:
            fut.set_exception(EngineDeadError(self._dead_reason()))
        for rid in leftover:
            self._deliver_error(rid, EngineDeadError(self._dead_reason()))


def _deliver(items: list[tuple[asyncio.Queue[_Streamed], RequestOutput]]) -> None:
    for stream, out in items:
        stream.put_nowait(out)
