"""``LLMEngine``: requests in, one batched step at a time, ``RequestOutput`` deltas out.

Not thread-safe: one thread drives it (``AsyncEngine`` in ``loop.py`` does that for the server).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from pathlib import Path

import torch

from frontier_runtime.config import RuntimeConfig
from frontier_runtime.distributed import StepSender, free_tcp_port
from frontier_runtime.engine.api import EngineStats, RequestOutput, SamplingParams
from frontier_runtime.engine.block_manager import BlockManager
from frontier_runtime.engine.detokenizer import IncrementalDetokenizer
from frontier_runtime.engine.model_runner import ModelRunner
from frontier_runtime.engine.sampler import Sampler
from frontier_runtime.engine.scheduler import Scheduler
from frontier_runtime.engine.sequence import Sequence, Status
from frontier_runtime.engine.tp_worker import worker_main
from frontier_runtime.models.llama.config import LlamaConfig, check_tensor_parallel
from frontier_runtime.tokenizer import Tokenizer

log = logging.getLogger("frontier_runtime.engine")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but no CUDA device is available (use 'cpu' or 'auto')")
    return device


class LLMEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_seq_len: int | None = None,
        max_batch_size: int = 16,
        max_num_batched_tokens: int = 1024,
        chunked_prefill: bool = True,
        block_size: int = 16,
        kv_cache_dtype: str = "auto",
        cpu_kv_cache_bytes: int = 256 * 1024 * 1024,
        gpu_memory_utilization: float = 0.9,
        num_blocks: int | None = None,
        prefix_caching: bool = True,
        tensor_parallel_size: int = 1,
        seed: int = 0,
    ) -> None:
        model_dir = Path(model_dir)
        device = resolve_device(device)
        self.tokenizer = Tokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None
        runner_kwargs = {
            "model_dir": str(model_dir),
            "dtype": dtype,
            "device": device,
            "block_size": block_size,
            "kv_cache_dtype": kv_cache_dtype,
            "cpu_kv_cache_bytes": cpu_kv_cache_bytes,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_num_batched_tokens": max_num_batched_tokens,
            "num_blocks": num_blocks,
        }
        if tensor_parallel_size > 1:
            check_tensor_parallel(LlamaConfig.from_dir(model_dir), tensor_parallel_size)
        init_method = f"tcp://127.0.0.1:{free_tcp_port()}" if tensor_parallel_size > 1 else ""
        self._workers, self._steps_out = self._start_workers(
            tensor_parallel_size, init_method, runner_kwargs, device
        )
        try:
            self.runner = ModelRunner(
                tp_rank=0, tp_size=tensor_parallel_size, tp_init_method=init_method, **runner_kwargs
            )
        except BaseException:
            for p in self._workers:
                p.terminate()
            raise
        cfg = self.runner.config
        self.model_config = cfg
        self.max_seq_len = max_seq_len or cfg.max_position_embeddings
        if self.max_seq_len > cfg.max_position_embeddings:
            self.shutdown()
            raise ValueError(
                f"model.max_seq_len {self.max_seq_len} exceeds the model's max_position_embeddings "
                f"({cfg.max_position_embeddings})"
            )
        needed = -(-self.max_seq_len // block_size)
        if needed > self.runner.num_blocks:
            have = self.runner.num_blocks * self.runner.bytes_per_block
            want = needed * self.runner.bytes_per_block
            self.shutdown()
            raise ValueError(
                f"model.max_seq_len {self.max_seq_len} needs {needed} KV blocks ({want} bytes) but the KV cache "
                f"holds {self.runner.num_blocks} blocks ({have} bytes): raise cache.cpu_kv_cache_bytes / "
                f"cache.gpu_memory_utilization or lower model.max_seq_len"
            )
        # Consecutive blocks only pay off where attention reads them in place (CPU, see ModelRunner).
        self.block_manager = BlockManager(
            self.runner.num_blocks, block_size, prefix_caching, keep_runs=self.runner.device.type == "cpu"
        )
        self.scheduler = Scheduler(
            self.block_manager, max_batch_size, max_num_batched_tokens, self.max_seq_len, chunked_prefill
        )
        self.sampler = Sampler(seed, self.runner.device)
        eos = set(cfg.eos_token_ids)
        if self.tokenizer is not None:
            eos.update(self.tokenizer.eos_token_ids)
        self.eos_token_ids = frozenset(eos)
        self._seqs: dict[str, Sequence] = {}
        self._pending: list[RequestOutput] = []  # aborts, delivered by the next step()
        self._arrivals = itertools.count()
        self._steps = 0
        self._last_batch = 0
        self._last_tokens = 0
        self._closed = False

    @classmethod
    def from_config(cls, config: RuntimeConfig, model_dir: str | Path) -> LLMEngine:
        s, c, par = config.scheduler, config.cache, config.parallel
        for name, value in (
            ("pipeline_parallel_size", par.pipeline_parallel_size),
            ("expert_parallel_size", par.expert_parallel_size),
        ):
            if value != 1:
                raise ValueError(
                    f"parallel.{name} = {value}: this runtime supports only 1 (tensor parallelism only)"
                )
        return cls(
            model_dir,
            dtype=config.model.dtype,
            device=config.device,
            max_seq_len=config.model.max_seq_len,
            max_batch_size=s.max_batch_size,
            max_num_batched_tokens=s.max_num_batched_tokens,
            chunked_prefill=s.chunked_prefill,
            block_size=c.block_size,
            kv_cache_dtype=c.kv_cache_dtype,
            cpu_kv_cache_bytes=c.cpu_kv_cache_bytes,
            gpu_memory_utilization=c.gpu_memory_utilization,
            prefix_caching=c.prefix_caching,
            tensor_parallel_size=config.parallel.tensor_parallel_size,
            seed=config.seed,
        )

    @staticmethod
    def _start_workers(
        tp: int, init_method: str, runner_kwargs: dict, device: str
    ) -> tuple[list, StepSender]:
        """Spawn ranks 1..tp-1; returns the processes and the sender that carries each step to them."""
        if tp == 1:
            return [], StepSender([])
        if device == "cuda" and torch.cuda.device_count() < tp:
            raise ValueError(
                f"parallel.tensor_parallel_size {tp} needs {tp} GPUs, found {torch.cuda.device_count()}"
            )
        ctx = torch.multiprocessing.get_context("spawn")
        threads = max(1, (os.cpu_count() or 1) // tp)
        workers, pipes = [], []
        for rank in range(1, tp):
            receive, send = ctx.Pipe(duplex=False)
            kwargs = dict(runner_kwargs, num_threads=threads)
            p = ctx.Process(
                target=worker_main,
                args=(rank, tp, init_method, kwargs, receive),
                daemon=True,
                name=f"frontier-tp-rank{rank}",
            )
            p.start()
            receive.close()  # the worker holds its own copy
            workers.append(p)
            pipes.append(send)
        return workers, StepSender(pipes)

    # -- requests -------------------------------------------------------------------------------

    def validate_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
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

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.validate_request(request_id, prompt_token_ids, params)
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else self.eos_token_ids
        )
        seq = Sequence(
            request_id,
            list(prompt_token_ids),
            params,
            next(self._arrivals),
            IncrementalDetokenizer(self.tokenizer, params.stop),
            stop_ids,
            self.runner.device,
        )
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; the next ``step()`` reports it as "abort"."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = "abort"
        self._pending.append(self._output(seq, [], "", None))
        return True

    def abort_all(self) -> int:
        """Abort every request in the engine; returns how many."""
        ids = list(self._seqs)
        for rid in ids:
            self.abort(rid)
        return len(ids)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        for seq in sched.finished:
            self._seqs.pop(seq.request_id, None)
            outputs.append(self._output(seq, [], seq.detokenizer.take_delta(True), None))
        if not sched.scheduled:
            return outputs
        self._steps += 1
        self._last_batch = len(sched.scheduled)
        self._last_tokens = sched.num_tokens

        step, samplers = self.runner.prepare(sched.scheduled)
        self._steps_out.send(step)
        logits = self.runner.execute(step)
        for seq, n in sched.scheduled:
            seq.num_computed_tokens += n
            self.block_manager.cache_computed_blocks(seq)
        if not samplers:
            return outputs
        result = self.sampler(logits, [s.params for s in samplers], [s.generator for s in samplers])
        for seq, token, lp in zip(samplers, result.token_ids, result.logprobs, strict=True):
            outputs.append(self._append_token(seq, token, lp))
        return outputs

    def _append_token(self, seq: Sequence, token: int, logprob) -> RequestOutput:  # noqa: ANN001
        seq.token_ids.append(token)
        reason = None
        if token in seq.stop_token_ids or seq.detokenizer.append(token) is not None:
            reason = "stop"
        elif seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_seq_len:
            reason = "length"
        if reason is not None:
            seq.finish_reason = reason
            if reason == "length":
                seq.detokenizer.flush()
            self.scheduler.remove(seq)
            seq.status = Status.FINISHED
            self._seqs.pop(seq.request_id, None)
        text = seq.detokenizer.take_delta(reason is not None)
        return self._output(seq, [token], text, None if logprob is None else [logprob])

    @staticmethod
    def _output(seq: Sequence, tokens: list[int], text: str, logprobs: list | None) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=tokens,
            new_text=text,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_prompt_tokens=seq.num_cached_prompt_tokens,
            logprobs=logprobs,
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
        steps_out = getattr(self, "_steps_out", None)
        if steps_out is not None:
            steps_out.close()
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.shutdown()
        deadline = time.monotonic() + timeout_s
        for p in getattr(self, "_workers", []):
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                log.warning("tensor-parallel worker %s did not exit; terminating it", p.name)
                p.terminate()
                p.join(1.0)

    def __del__(self) -> None:  # best effort: workers are daemons anyway
        with contextlib.suppress(Exception):  # interpreter teardown
            self.shutdown(timeout_s=1.0)
