"""Prometheus metrics, named like vLLM's so existing dashboards keep working (names: ``frontier_hostside.names``).

Each app owns its own ``CollectorRegistry`` (several apps can live in one test process). Gauges
that mirror engine state are read from ``engine.stats()`` at scrape time, so they are never stale.
Besides vLLM's names, the failure counter counts refusals by reason, and the HTTP request counter
and duration histogram let a deploy gate compute the error rate and p99 from one scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from frontier_hostside import names
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frontier_runtime.engine.api import EngineStats
from frontier_runtime.requests import FINISH_REASONS
from frontier_runtime.server.auth import ApiKeys

# The key set in use and when it was loaded (wall clock), or (None, None) when auth is off.
KeysState = Callable[[], tuple[ApiKeys | None, float | None]]

TTFT_BUCKETS = (.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (.01, .025, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (.3, .5, .8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
HTTP_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)  # fmt: skip

FAILURE_REASONS = ("queue_full", "queue_timeout", "invalid", "unauthorized", "draining", "too_large", "not_found", "client_disconnect", "engine_error", "not_ready", "structured_output_invalid")  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The phases of one start, in order (serve.py measures them): fetch and verify overlap on a
#: parallel fetch; ready is the whole start, from serve() being called to readiness.
START_PHASES = ("fetch", "verify", "load", "warmup", "ready")


class ServerMetrics:
    def __init__(
        self,
        model_name: str,
        engine_stats: Callable[[], EngineStats | None],
        queue_state: Callable[[], tuple[int, int]],
        health_state: Callable[[], tuple[bool, bool]],
        keys_state: KeysState | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        per_model = [names.MODEL_LABEL]
        reg = self.registry

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, labels, registry=reg)

        def histogram(
            name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = per_model
        ) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=reg)

        # One metric a line: its name, help, buckets where it has them, and labels where not per model.
        # fmt: off
        self.prompt_tokens = counter(names.PROMPT_TOKENS_METRIC, "Prompt tokens processed.", per_model)
        self.generation_tokens = counter(names.GENERATION_TOKENS_METRIC, "Tokens generated.", per_model)
        self.request_success = counter(names.REQUEST_SUCCESS_METRIC, "Requests finished, by finish reason.", [*per_model, names.FINISHED_REASON_LABEL])
        self.ttft = histogram(names.TTFT_METRIC, "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram(names.ITL_METRIC, "Gap between consecutive output tokens.", TOKEN_LATENCY_BUCKETS)
        self.tpot = histogram(names.TPOT_METRIC, "(e2e - ttft) / (output tokens - 1) per request.", TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram(names.E2E_LATENCY_METRIC, "Arrival to last token.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram(names.QUEUE_TIME_METRIC, "Time spent waiting for admission.", REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram(names.REQUEST_PROMPT_TOKENS_METRIC, "Prompt length per request.", TOKEN_COUNT_BUCKETS)
        self.request_generation_tokens = histogram(names.REQUEST_GENERATION_TOKENS_METRIC, "Output length per request.", TOKEN_COUNT_BUCKETS)
        self.failures = counter(names.REQUEST_FAILURES_METRIC, "Requests refused or failed, by reason.", [names.REASON_LABEL])
        self.structured_outputs = counter(names.STRUCTURED_OUTPUTS_METRIC, "Constrained outputs checked against their constraint (finished with stop).")
        self.http_requests = counter(names.HTTP_REQUESTS_METRIC, "HTTP requests answered, by route and status.", [names.ROUTE_LABEL, names.STATUS_LABEL])
        self.http_duration = histogram(names.HTTP_DURATION_METRIC, "HTTP request duration, by route.", HTTP_BUCKETS, [names.ROUTE_LABEL])
        self.key_reload_failures = counter(names.API_KEYS_RELOAD_FAILURES_METRIC, "Reloads of the API keys that failed (the keys loaded before stay in use).")
        # fmt: on
        # No sample before a phase ends: a 0 would read as "took no time".
        self.start_phases = Gauge(
            names.START_PHASE_METRIC,
            "Seconds this process's start spent in each phase (fetch and verify overlap).",
            [names.START_PHASE_LABEL],
            registry=reg,
        )
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        # Export every series from the first scrape (at zero), so rates and alerts work from the start.
        for family in (
            self.prompt_tokens,
            self.generation_tokens,
            self.ttft,
            self.itl,
            self.tpot,
            self.e2e,
            self.queue_time,
            self.request_prompt_tokens,
            self.request_generation_tokens,
        ):
            family.labels(model_name)
        for reason in FINISH_REASONS:
            self.request_success.labels(model_name, reason)
        reg.register(_LiveCollector(model_name, engine_stats, queue_state, health_state))
        # The process's own resident memory, CPU seconds and start time (process_*): what a soak
        # judges for leaks and restarts, and the local stack's resource metrics.
        ProcessCollector(registry=reg)
        reg.register(_GpuCollector())
        reg.register(_KeysCollector(keys_state or (lambda: (None, None))))

    def finished(
        self,
        *,
        finish_reason: str,
        prompt_tokens: int,
        completion_tokens: int,
        e2e_s: float,
        ttft_s: float | None,
    ) -> None:
        m = self.model_name
        self.request_success.labels(m, finish_reason).inc()
        self.request_prompt_tokens.labels(m).observe(prompt_tokens)
        self.request_generation_tokens.labels(m).observe(completion_tokens)
        self.e2e.labels(m).observe(e2e_s)
        if ttft_s is not None and completion_tokens > 1:
            self.tpot.labels(m).observe((e2e_s - ttft_s) / (completion_tokens - 1))

    def start_phase(self, phase: str, seconds: float) -> None:
        if phase not in START_PHASES:
            raise ValueError(f"start phase {phase!r}: must be one of {', '.join(START_PHASES)}")
        self.start_phases.labels(phase).set(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _GpuCollector(Collector):
    """The GPUs this process sees, and each one's utilisation and memory in use as NVML reports them
    (the whole device's, whichever process of the replica drives it). NVML creates no CUDA context,
    so a scrape costs no GPU memory. A CPU host exports ``frontier_gpus 0`` and no per-GPU series:
    a utilisation of 0 would read as an idle GPU that is not there."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda
        self._count = torch.cuda.device_count() if torch.cuda.is_available() else 0

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(names.GPUS_METRIC, "GPUs this runtime's process sees.", value=self._count)
        if not self._count:
            return
        util = GaugeMetricFamily(
            names.GPU_UTILIZATION_METRIC, "GPU utilisation over NVML's last sample period, percent.",
            labels=[names.DEVICE_LABEL],
        )  # fmt: skip
        used = GaugeMetricFamily(
            names.GPU_MEMORY_USED_METRIC,
            "GPU memory in use on the device, bytes.",
            labels=[names.DEVICE_LABEL],
        )
        try:
            for device in range(self._count):
                util.add_metric([str(device)], self._cuda.utilization(device))
                used.add_metric([str(device)], self._cuda.device_memory_used(device))
        except (ModuleNotFoundError, RuntimeError):
            return  # NVML (nvidia-ml-py) absent or not answering: the count alone says GPUs are there
        yield util
        yield used


# What the engine gauges and counters read before an engine is loaded: 0 each, and no engine info.
_NO_ENGINE = EngineStats(
    running=0,
    waiting=0,
    kv_blocks_total=0,
    kv_blocks_free=0,
    num_preemptions=0,
    prefix_cache_queries=0,
    prefix_cache_hits=0,
    last_batch_size=0,
    last_step_tokens=0,
    steps=0,
)


_Family = type[GaugeMetricFamily] | type[CounterMetricFamily]
# The engine's series exported after running and waiting, in this order: the family, its name and
# help, and the field of EngineStats it reads.
_ENGINE_SERIES: tuple[tuple[_Family, str, str, str], ...] = (
    (GaugeMetricFamily, names.KV_USAGE_METRIC, "Fraction of KV cache blocks in use (0..1).", "kv_usage"),
    (CounterMetricFamily, names.PREEMPTIONS_METRIC, "Sequences preempted.", "num_preemptions"),
    (CounterMetricFamily, names.PREFIX_CACHE_QUERIES_METRIC, "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
    (CounterMetricFamily, names.PREFIX_CACHE_HITS_METRIC, "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
    (GaugeMetricFamily, names.BATCH_SIZE_METRIC, "Sequences in the engine's last step.", "last_batch_size"),
    (GaugeMetricFamily, names.STEP_TOKENS_METRIC, "Tokens in the engine's last step.", "last_step_tokens"),
    (CounterMetricFamily, names.ENGINE_STEPS_METRIC, "Engine steps taken.", "steps"),
    (GaugeMetricFamily, names.KV_BLOCKS_TOTAL_METRIC, "KV cache blocks.", "kv_blocks_total"),
    (GaugeMetricFamily, names.KV_BLOCKS_FREE_METRIC, "KV cache blocks free.", "kv_blocks_free"),
)  # fmt: skip
# Then prefill/decode disaggregation's (0 on a colocated replica).
_KV_TRANSFER_SERIES: tuple[tuple[_Family, str, str, str], ...] = (
    (CounterMetricFamily, names.KV_TRANSFER_BLOCKS_PULLED_METRIC, "KV blocks pulled from prefill replicas.", "kv_blocks_pulled"),
    (CounterMetricFamily, names.KV_TRANSFER_PULL_FAILURES_METRIC, "KV pulls from prefill replicas that failed.", "kv_pulls_failed"),
    (GaugeMetricFamily, names.KV_TRANSFER_LEASES_METRIC, "Prompts whose KV blocks wait for a decode replica.", "kv_leases"),
    (CounterMetricFamily, names.KV_TRANSFER_LEASES_EXPIRED_METRIC, "KV leases that expired unclaimed.", "kv_leases_expired"),
)  # fmt: skip


@dataclass(eq=False)  # the registry keys its collectors by identity
class _LiveCollector(Collector):
    """Gauges read at scrape time from the engine, the admission queue and the health state."""

    model: str
    engine_stats: Callable[[], EngineStats | None]
    queue_state: Callable[[], tuple[int, int]]
    health_state: Callable[[], tuple[bool, bool]]

    def collect(self) -> Iterable[Metric]:
        stats = self.engine_stats() or _NO_ENGINE
        admitted, queued = self.queue_state()
        ready, draining = self.health_state()

        def sample(name: str, doc: str, value: float, family: _Family = GaugeMetricFamily) -> Metric:
            """A family with one sample, this model's."""
            metric = family(name, doc, labels=[names.MODEL_LABEL])
            metric.add_metric([self.model], value)
            return metric

        yield sample(names.RUNNING_METRIC, "Sequences running in the engine.", stats.running)
        yield sample(
            names.WAITING_METRIC,
            "Requests waiting: in the admission queue plus in the engine's own queue.",
            queued + stats.waiting,
        )
        for family, name, doc, field in (*_ENGINE_SERIES, *_KV_TRANSFER_SERIES):
            yield sample(name, doc, getattr(stats, field), family)
        yield sample(names.ADMITTED_METRIC, "Requests holding an engine slot.", admitted)
        yield sample(names.QUEUED_METRIC, "Requests in the admission queue.", queued)
        yield sample(names.READY_METRIC, "1 when the readiness check passes.", 1.0 if ready else 0.0)
        yield sample(names.DRAINING_METRIC, "1 while draining before exit.", 1.0 if draining else 0.0)
        info = GaugeMetricFamily(
            names.ENGINE_INFO_METRIC,
            "1, labelled with the engine's attention backend and kernels (no sample before it loads).",
            labels=[names.MODEL_LABEL, names.ATTENTION_BACKEND_LABEL, names.KERNELS_LABEL],
        )
        if stats.attention_backend:
            info.add_metric([self.model, stats.attention_backend, stats.kernels], 1.0)
        yield info
        yield sample(
            names.INTERCONNECT_BUS_METRIC,
            "All-reduce bus bandwidth the replica's ranks measured at start (GB/s, nccl-tests' busbw; 0: one rank).",
            stats.interconnect_bus_gbps,
        )


class _KeysCollector(Collector):
    """The key set in use, read at scrape time: how many keys, how old, and which set (by fingerprint)."""

    def __init__(self, keys_state: KeysState) -> None:
        self._keys_state = keys_state

    def collect(self) -> Iterable[Metric]:
        keys, loaded_at = self._keys_state()
        yield GaugeMetricFamily(
            names.API_KEYS_LOADED_METRIC,
            "API keys in the set in use (0: auth is off).",
            len(keys) if keys else 0,
        )
        # An age growing past the reload interval means reloads are failing (or not running).
        age = max(0.0, time.time() - loaded_at) if loaded_at is not None else 0.0
        yield GaugeMetricFamily(
            names.API_KEYS_AGE_METRIC, "Seconds since the API keys in use were loaded.", age
        )
        info = GaugeMetricFamily(
            names.API_KEYS_INFO_METRIC,
            "1, labelled with the fingerprint of the key set in use (no sample when auth is off).",
            labels=[names.KEYS_FINGERPRINT_LABEL],
        )
        if keys is not None:
            info.add_metric([keys.fingerprint], 1.0)
        yield info
