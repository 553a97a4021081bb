"""``LLMEngine``: requests in, one batched step at a time, ``RequestOutput`` deltas out.

Not thread-safe: one thread drives it (``AsyncEngine`` in ``loop.py`` does that for the server).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from frontier_runtime.config import RuntimeConfig
from frontier_runtime.engine.affinity import pin_if_configured
from frontier_runtime.engine.api import EngineStats, KvTransferError
from frontier_runtime.engine.block_manager import BlockManager
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.kv_events import KvEventLog, KvEventPublisher
from frontier_runtime.engine.kv_transfer import KvTransfer
from frontier_runtime.engine.model_runner import Launched, ModelRunner
from frontier_runtime.engine.nodes import ReplicaError
from frontier_runtime.engine.output_processor import OutputProcessor
from frontier_runtime.engine.sampler import Sampler
from frontier_runtime.engine.scheduler import Scheduler, SchedulerOutput
from frontier_runtime.engine.sequence import Sequence, Status
from frontier_runtime.engine.tp_worker import TPWorkers
from frontier_runtime.requests import FinishReason, RequestOutput, SamplingParams, TokenLogprob
from frontier_runtime.structured.decoding import PendingMasks, StructuredDecoder
from frontier_runtime.tokenizer import Tokenizer


@dataclass
class _InFlight:
    """A launched step: what was scheduled, who samples, and the runner's handle to its logits."""

    scheduled: list[tuple[Sequence, int]]
    samplers: list[Sequence]
    masks: PendingMasks | None
    launched: Launched


class LLMEngine:
    def __init__(self, config: EngineConfig | str | Path, **settings: Any) -> None:
        """``LLMEngine(EngineConfig(...))``, or ``LLMEngine(model_dir, **settings)`` with the same fields."""
        if isinstance(config, EngineConfig):
            config = config.updated(**settings) if settings else config
        else:
            config = EngineConfig(model_dir=Path(config), **settings)
        self.config = config
        if config.cpu_threads:  # rank 0 takes its share of the budget, like the other ranks
            torch.set_num_threads(config.threads_per_rank)
        pin_if_configured(config, rank=0)
        model_dir = config.model_dir
        self.tokenizer = Tokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None
        # Text and stop strings, in the step; AsyncEngine turns this off and runs them on its own
        # output thread (``set_detokenize_inline``).
        self.detokenize = True
        self.outputs = OutputProcessor(self.tokenizer)
        self.workers = TPWorkers(config)
        try:
            self.runner = ModelRunner(config, rank=0, init_method=self.workers.init_method)
        except BaseException:
            self.workers.terminate()
            raise
        # Told when a rank of the replica is lost (AsyncEngine fails its requests and stops then).
        self.on_replica_lost: Callable[[str], None] = lambda why: None
        self.workers.watch(lambda why: self.on_replica_lost(why))
        cfg = self.runner.model_config
        self.model_config = cfg
        self.max_seq_len = config.max_seq_len or cfg.max_position_embeddings
        if self.max_seq_len > cfg.max_position_embeddings:
            self.shutdown()
            raise ValueError(
                f"model.max_seq_len {self.max_seq_len} exceeds the model's max_position_embeddings "
                f"({cfg.max_position_embeddings})"
            )
        needed = -(-self.max_seq_len // config.block_size)
        if needed > self.runner.num_blocks:
            have = self.runner.num_blocks * self.runner.bytes_per_block
            want = needed * self.runner.bytes_per_block
            self.shutdown()
            raise ValueError(
                f"model.max_seq_len {self.max_seq_len} needs {needed} KV blocks ({want} bytes) but the KV cache "
                f"holds {self.runner.num_blocks} blocks ({have} bytes): raise cpu_kv_cache_bytes / "
                f"gpu_memory_utilization or lower model.max_seq_len"
            )
        # Blocks behind the window are freed only where every layer slides: a full layer reads them.
        every_layer_slides = len(cfg.sliding_layers) == cfg.num_layers
        window = (cfg.sliding_window or 0) if every_layer_slides else 0
        self.block_manager = BlockManager(config, self.runner.num_blocks, window=window)
        self.scheduler = Scheduler(config, self.block_manager)
        try:  # prefill/decode disaggregation: the prefill's listener, the decode's pulls
            self.kv_transfer = KvTransfer(
                config.kv_transfer, self.block_manager, self.runner.kv_caches, config.ranks
            )
        except BaseException:
            self.shutdown()
            raise
        # Requests a failed KV pull ended (kv_transfer.on_failure 'fail'), for take_failed().
        self._failed: list[tuple[str, KvTransferError]] = []
        self.kv_events: KvEventPublisher | None = None
        if config.kv_events.enabled and config.prefix_caching:
            ev = config.kv_events
            try:
                self.kv_events = KvEventPublisher(ev.port, ev.replay_port, ev.topic, ev.buffer_steps)
            except BaseException:
                self.shutdown()
                raise
            self.block_manager.events = KvEventLog(config.block_size)
        self.sampler = Sampler(config.seed, self.runner.device)
        eos = set(cfg.eos_token_ids)
        if self.tokenizer is not None:
            eos.update(self.tokenizer.eos_token_ids)
        self.eos_token_ids = frozenset(eos)
        self.structured = StructuredDecoder.for_model(
            model_dir, cfg.vocab_size, self.eos_token_ids, pin_memory=self.runner.device.type == "cuda"
        )
        self._seqs: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []  # aborts, delivered by the next step()
        # Steps launched and not yet sampled: one at a time, or one per pipeline stage under PP.
        self._in_flight: deque[_InFlight] = deque()
        self.steps_in_flight = config.pipeline_parallel_size
        self._arrivals = itertools.count()
        self._steps = 0
        self._last_batch = 0
        self._last_tokens = 0
        self._closed = False

    @classmethod
    def from_config(cls, config: RuntimeConfig, model_dir: str | Path) -> LLMEngine:
        return cls(EngineConfig.from_runtime(config, model_dir))

    # -- requests -------------------------------------------------------------------------------

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError for a request the engine would refuse. Safe to call from any thread."""
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        if len(prompt_token_ids) >= self.max_seq_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens; this model's context is {self.max_seq_len} tokens "
                f"and at least one must remain for the completion"
            )
        vocab = self.model_config.vocab_size
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.structured is not None and self.structured is None:
            raise ValueError("structured output needs the model's tokenizer.json, which this model lacks")
        self.kv_transfer.check(params.kv_transfer)
        if params.continuation is not None:
            resumed = params.continuation.output_token_ids
            bad = next((t for t in resumed if not 0 <= t < vocab), None)
            if bad is not None:
                raise ValueError(f"continuation token id {bad} is outside the vocabulary (0..{vocab - 1})")
            if len(prompt_token_ids) + len(resumed) >= self.max_seq_len:
                raise ValueError(
                    f"prompt ({len(prompt_token_ids)}) and continuation ({len(resumed)}) tokens fill this "
                    f"model's context of {self.max_seq_len} tokens"
                )

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.validate_request(prompt_token_ids, params)
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if params.structured is not None:
            assert self.structured is not None  # validate_request refuses structured output without it
            resumed = params.continuation.output_token_ids if params.continuation is not None else ()
            # A bad constraint, or a continuation its grammar refuses, raises ValueError.
            self.structured.add(request_id, params.structured, resumed)
        stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else self.eos_token_ids
        )
        seq = Sequence(
            request_id,
            list(prompt_token_ids),
            params,
            next(self._arrivals),
            stop_ids,
            self.runner.device,
            self.model_config.vocab_size,
        )
        self._seqs[request_id] = seq
        if not self.kv_transfer.start_pull(seq):  # a pull schedules it once its blocks are here
            self.scheduler.add(seq)
        if self.detokenize:
            self.outputs.add(request_id, params.stop, params.continuation)

    def set_detokenize_inline(self, inline: bool) -> None:
        """Whether ``step()`` adds text and applies stop strings (before any request arrives)."""
        if self._seqs:
            raise RuntimeError("detokenization moves only while the engine holds no request")
        self.detokenize = inline

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; the next ``step()`` reports it as "abort"."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.kv_transfer.cancel(request_id)
        self.scheduler.remove(seq)
        self._release_structured(seq.request_id)
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"
        seq.times.finished = time.monotonic()
        self._pending.append(self._output(seq, []))
        return True

    def abort_all(self) -> int:
        """Abort every request in the engine; returns how many."""
        ids = list(self._seqs)
        for rid in ids:
            self.abort(rid)
        return len(ids)

    def has_unfinished(self) -> bool:
        return (
            self.scheduler.has_unfinished()
            or bool(self._pending)
            or bool(self._in_flight)
            or self.kv_transfer.busy
        )

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule and launch one step; return the outputs of the oldest step in flight once it is
        done. Without pipeline parallelism that is the step just launched. With PP stages, up to PP
        steps of disjoint sequences are in flight: while the later stages work on one, rank 0's
        stage starts the next, so no stage idles while rank 0 samples and schedules."""
        outputs, self._pending = self._pending, []
        self._tend_transfers()
        busy = {seq for flight in self._in_flight for seq, _ in flight.scheduled}
        sched = self.scheduler.schedule(busy, self._step_share())
        for seq in sched.finished:
            self._seqs.pop(seq.request_id, None)
            self._release_structured(seq.request_id)
            outputs.append(self._output(seq, []))
        if sched.scheduled:
            self._launch(sched)
            if self.kv_events is not None:
                self.kv_events.publish(self.block_manager.events.take() if self.block_manager.events else [])
        if self._in_flight and (len(self._in_flight) >= self.steps_in_flight or not sched.scheduled):
            outputs += self._collect(self._in_flight.popleft())
        return self._with_text(outputs)

    def _step_share(self) -> int | None:
        """Sequences one step may take: with several steps in flight, an even share of the work
        (so each step carries its part of the batch, not the first all of it and the others none)."""
        if self.steps_in_flight == 1:
            return None
        work = len(self.scheduler.running) + len(self.scheduler.waiting)
        return max(1, -(-work // self.steps_in_flight))

    def _launch(self, sched: SchedulerOutput) -> None:
        self._steps += 1
        self._last_batch = len(sched.scheduled)
        self._last_tokens = sched.num_tokens
        started = time.monotonic()  # one clock read per step: the requests' traces use it
        bm = self.block_manager
        step, samplers = self.runner.prepare(sched.scheduled, bm.row_of, bm.take_table_updates())
        if self.steps_in_flight > 1:
            # The other steps in flight keep the stages busy: splitting this one would only make
            # each stage read its weights once more per micro-batch.
            step.micro_batches = 1
        masks = self.structured.start(samplers) if self.structured is not None else None
        if self.workers.lost is not None:  # a step now would wait on a rank that is gone
            raise ReplicaError(f"the replica lost a rank: {self.workers.lost}")
        self.workers.send(step)
        launched = self.runner.launch(step)
        caching, window, block_size = bm.enable_prefix_caching, bm.window, bm.block_size
        for seq, n in sched.scheduled:
            seq.num_computed_tokens += n
            # Only a step that fills a block registers one: most decodes skip the call.
            if caching and seq.num_computed_tokens // block_size > seq.num_hashed_blocks:
                bm.cache_computed_blocks(seq)
            if window:
                bm.release_behind_window(seq)
            if seq.times.scheduled is None:
                seq.times.scheduled = started
        self._in_flight.append(_InFlight(sched.scheduled, samplers, masks, launched))

    def _collect(self, flight: _InFlight) -> list[RequestOutput]:
        logits = self.runner.collect(flight.launched)
        if not flight.samplers:
            return []
        result = self.sampler(
            logits,
            [s.params for s in flight.samplers],
            [s.generator for s in flight.samplers],
            flight.masks.result() if flight.masks is not None else None,
        )
        sampled = time.monotonic()
        outputs = []
        for seq, token, lp in zip(flight.samplers, result.token_ids, result.logprobs, strict=True):
            if seq.status is Status.FINISHED:  # aborted while its step was in flight
                continue
            if seq.times.first_token is None:
                seq.times.first_token = sampled
            outputs.append(self._append_token(seq, token, lp))
        return outputs

    def _append_token(self, seq: Sequence, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        seq.token_ids.append(token)
        n = len(seq.token_ids)
        reason: FinishReason | None = None
        stop_reason = None
        grammar = self.structured.accept(seq.request_id, token) if self.structured is not None else None
        if token in seq.stop_token_ids:
            reason, stop_reason = "stop", token
        elif grammar is not None:  # the constraint is complete (or, never expected, broken)
            reason = grammar
        elif n - seq.num_prompt_tokens >= seq.params.max_tokens or n >= self.max_seq_len:
            reason = "length"
        leased = None
        if reason is not None:
            seq.finish_reason = reason
            leased = self.kv_transfer.lease(seq)  # before _finish frees the sequence's blocks
            self._finish(seq)
        out = self._output(seq, [token], None if logprob is None else [logprob], stop_reason)
        out.kv_transfer_params = leased
        return out

    def _tend_transfers(self) -> None:
        """Leases claimed or expired; pulls done: scheduled, recomputed, or failed by policy."""
        kv = self.kv_transfer
        if kv.busy and not self.scheduler.has_unfinished() and not self._in_flight:
            kv.wait(0.01)  # nothing else to run: wait for a pull rather than spin empty steps
        tended = kv.tend()
        for seq in tended.ready:
            if seq.request_id in self._seqs:
                self.scheduler.add(seq)
        for seq, exc in tended.failed:
            if self._seqs.pop(seq.request_id, None) is None:
                continue
            self._release_structured(seq.request_id)
            if self.detokenize:
                self.outputs.discard(seq.request_id)
            seq.status = Status.FINISHED
            seq.times.finished = time.monotonic()
            self._failed.append((seq.request_id, exc))

    def end_leases(self) -> int:
        """Free the blocks of leases claimed or expired (an idle engine's loop calls this); how many."""
        return self.kv_transfer.end_leases()

    def take_failed(self) -> list[tuple[str, KvTransferError]]:
        """Requests ended by a failed KV pull since the last call, each with its error."""
        failed, self._failed = self._failed, []
        return failed

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self._release_structured(seq.request_id)
        seq.status = Status.FINISHED
        seq.times.finished = time.monotonic()
        self._seqs.pop(seq.request_id, None)

    def _with_text(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """The outputs with their text (inline detokenization); a stop string ends its request now."""
        if not self.detokenize:
            return outputs
        process = self.outputs.process
        for out in outputs:  # filled in place (``OutputProcessor.process``)
            if process(out).stopped_by_text:
                seq = self._seqs.get(out.request_id)
                if seq is not None:
                    seq.finish_reason = "stop"
                    self._finish(seq)
        return outputs

    def _release_structured(self, request_id: str) -> None:
        if self.structured is not None:
            self.structured.release(request_id)

    @staticmethod
    def _output(
        seq: Sequence,
        tokens: list[int],
        logprobs: list[TokenLogprob] | None = None,
        stop_reason: int | str | None = None,
    ) -> RequestOutput:
        """Token ids only: the text comes from an ``OutputProcessor`` (inline or on another thread)."""
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=tokens,
            new_text="",
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_prompt_tokens=seq.num_cached_prompt_tokens,
            logprobs=logprobs,
            stop_reason=stop_reason,
            times=seq.times,
        )

    # -- introspection --------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=bm.num_blocks,
            kv_blocks_free=bm.num_free_blocks,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            last_batch_size=self._last_batch,
            last_step_tokens=self._last_tokens,
            steps=self._steps,
            attention_backend=self.runner.backend.name,
            kernels=self.runner.kernels,
            interconnect_bus_gbps=self.runner.interconnect.bus_gbps if self.runner.interconnect else 0.0,
            kv_blocks_pulled=self.kv_transfer.blocks_pulled,
            kv_pulls_failed=self.kv_transfer.pulls_failed,
            kv_leases=len(self.kv_transfer.leases),
            kv_leases_expired=self.kv_transfer.leases_expired,
        )

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[list[int]]:
        """Run prompts to completion (offline use, tests, benches); returns each one's output ids."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{next(self._arrivals)}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, plist, strict=True):
            self.add_request(rid, prompt, p)
        got: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished():
            for out in self.step():
                if out.request_id in got:
                    got[out.request_id].extend(out.new_token_ids)
        return [got[rid] for rid in ids]

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        in_flight = getattr(self, "_in_flight", ())
        while in_flight:  # every rank sees each launched step through before it is told to stop
            self.runner.collect(in_flight.popleft().launched)
        # getattr: a constructor that failed part way leaves the later parts unset.
        for name in ("structured", "kv_events", "kv_transfer", "workers"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()
        workers = getattr(self, "workers", None)
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.shutdown()
        if workers is not None:
            workers.join(timeout_s)

    def __del__(self) -> None:  # best effort: workers are daemons anyway
        # Not contextlib.suppress: at interpreter exit the contextlib module may already be gone.
        try:  # noqa: SIM105
            self.shutdown(timeout_s=1.0)
        except Exception:
            pass
