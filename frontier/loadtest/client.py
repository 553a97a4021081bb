"""Load generation against any OpenAI-compatible endpoint, streaming with usage by default.

Three shapes of load, as in vLLM's ``benchmark_serving`` and genai-perf:

* **Poisson arrivals** at a rate: gaps drawn from a gamma distribution with shape ``burstiness``
  and mean ``1 / rate`` (burstiness 1 is a Poisson process; below 1 burstier, above 1 steadier).
* **Fixed concurrency**: N clients, each sending its next request when the last one finished.
* **A step load**: a list of Poisson rates, each held for a duration, back to back — the sweep that
  finds the knee (see :func:`frontier.loadtest.stats.find_knee`).

Every request is a streamed ``/v1/completions`` (or ``/v1/chat/completions``) call with
``stream_options.include_usage``; the client timestamps each server-sent event and turns the stream
into a :class:`~frontier.loadtest.stats.RequestSample`. With ``Target.stream`` off a request is one
non-streamed answer (no TTFT), which HAProxy may retry on another host until it has begun. Failures are samples too, classified by kind
(``http_429``, ``connect``, ``timeout``, ``disconnect``, ``truncated``, ...), never exceptions.

:class:`BackgroundLoad` keeps a steady load running in a thread while something else happens (a
deploy, a rollback) and hands back every sample when stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx
import numpy as np

from frontier.errors import FrontierError
from frontier.loadtest.stats import RequestSample

Endpoint = Literal["completions", "chat"]
OnEvent = Callable[[str, RequestSample | None], None]

# Words for synthetic prompts: plain ASCII so any byte-level tokenizer sees ~1-2 tokens per word.
_TEXT = (
    "the of and to in is that for it as with was on be at by this had not are but from or have an they "
    "which one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must through"
)
_WORDS = _TEXT.split()


class LoadTestError(FrontierError):
    """A load test that cannot run as asked (bad rates, unreachable target before the first request)."""


@dataclass(frozen=True)
class Target:
    """Where requests go and what they ask for."""

    base_url: str
    model: str
    api_key: str | None = None
    endpoint: Endpoint = "completions"
    prompt_tokens: int = 32
    #: Prompt lengths to mix, each request drawing one uniformly (empty: ``prompt_tokens`` alone),
    #: so one run measures every input-length bucket the report splits it into.
    prompt_mix: tuple[int, ...] = ()
    max_tokens: int = 32
    timeout_s: float = 60.0
    # Generate exactly max_tokens (as vLLM's benchmark does), so every request costs the same.
    ignore_eos: bool = True
    extra_body: dict = field(default_factory=dict)
    # Streamed (the default) times every token; a non-streamed request gets one answer, which a
    # balancer can still retry on another host when the one serving it dies before answering.
    stream: bool = True

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, prompt: str) -> dict:
        body: dict = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
        }
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body.update(self.extra_body)
        return body


def prompt_words(target: Target, rng: np.random.Generator) -> int:
    """Words of the next request's prompt (about 0.75 per token): its length drawn from the mix."""
    tokens = int(rng.choice(target.prompt_mix)) if target.prompt_mix else target.prompt_tokens
    return max(1, int(tokens * 0.75))


def make_prompt(rng: np.random.Generator, words: int) -> str:
    """A prompt of ``words`` random common words; distinct per request so prefix caches do not flatter."""
    picks = rng.integers(0, len(_WORDS), size=max(1, words))
    return " ".join(_WORDS[i] for i in picks)


def arrival_times(
    rate: float, duration_s: float, rng: np.random.Generator, burstiness: float = 1.0
) -> list[float]:
    """Offsets (seconds from the start) of requests arriving at ``rate``/s over ``duration_s``.

    Gaps are gamma-distributed with shape ``burstiness`` and scale ``1 / (rate * burstiness)``, so the
    mean gap is ``1 / rate`` whatever the burstiness.
    """
    if rate <= 0:
        raise LoadTestError(f"rate = {rate}: must be > 0 requests per second")
    if burstiness <= 0:
        raise LoadTestError(f"burstiness = {burstiness}: must be > 0 (1 is Poisson)")
    times: list[float] = []
    t = 0.0
    while True:
        t += float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))
        if t >= duration_s:
            return times
        times.append(t)


def _content(chunk: dict) -> str:
    """The text a streamed chunk carries (completions: ``text``; chat: ``delta.content``)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    first = choices[0]
    if "text" in first:
        return first.get("text") or ""
    return (first.get("delta") or {}).get("content") or ""


# How a request that did not complete failed, by the exception that ended it.
_FAILURE_KINDS: tuple[tuple[tuple[type[Exception], ...], str], ...] = (
    ((httpx.ConnectError, httpx.ConnectTimeout), "connect"),
    ((httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout), "timeout"),
    ((httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError), "disconnect"),
    ((json.JSONDecodeError,), "protocol"),
)
_FAILURES = tuple(kind for kinds, _ in _FAILURE_KINDS for kind in kinds)


def _failed(sent: float, exc: Exception) -> RequestSample:
    error = next(name for kinds, name in _FAILURE_KINDS if isinstance(exc, kinds))
    return RequestSample(sent_at=sent, ok=False, error=error)


async def stream_request(client: httpx.AsyncClient, target: Target, prompt: str) -> RequestSample:
    """Send one streaming request and time its server-sent events."""
    sent = time.perf_counter()
    stamps: list[float] = []
    usage: dict = {}
    done = False
    try:
        async with client.stream(
            "POST", target.url, json=target.body(prompt), headers=target.headers()
        ) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return RequestSample(sent_at=sent, ok=False, error=f"http_{resp.status_code}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and ': keep-alive' comments
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    return RequestSample(sent_at=sent, ok=False, error="stream_error")
                if _content(chunk):
                    stamps.append(time.perf_counter())
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except _FAILURES as exc:
        return _failed(sent, exc)
    if not done:
        return RequestSample(sent_at=sent, ok=False, error="truncated")
    if not stamps:
        return RequestSample(sent_at=sent, ok=False, error="empty")
    return RequestSample(
        sent_at=sent,
        ok=True,
        ttft_s=stamps[0] - sent,
        e2el_s=stamps[-1] - sent,
        itl_s=tuple(b - a for a, b in zip(stamps, stamps[1:], strict=False)),
        output_tokens=int(usage.get("completion_tokens") or len(stamps)),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
    )


async def whole_request(client: httpx.AsyncClient, target: Target, prompt: str) -> RequestSample:
    """Send one non-streamed request; its latency is the whole answer's (there is no first token)."""
    sent = time.perf_counter()
    try:
        resp = await client.post(target.url, json=target.body(prompt), headers=target.headers())
        answer = resp.json() if resp.status_code == 200 else None
    except _FAILURES as exc:
        return _failed(sent, exc)
    if answer is None:
        return RequestSample(sent_at=sent, ok=False, error=f"http_{resp.status_code}")
    usage = answer.get("usage") or {}
    if not answer.get("choices") or not usage.get("completion_tokens"):
        return RequestSample(sent_at=sent, ok=False, error="empty")
    return RequestSample(
        sent_at=sent,
        ok=True,
        e2el_s=time.perf_counter() - sent,
        output_tokens=int(usage["completion_tokens"]),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
    )


def _client(target: Target) -> httpx.AsyncClient:
    timeout = httpx.Timeout(target.timeout_s, connect=min(5.0, target.timeout_s))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


async def _guarded(
    client: httpx.AsyncClient,
    target: Target,
    prompt: str,
    slots: asyncio.Semaphore | None,
    on_event: OnEvent | None,
) -> RequestSample:
    async with slots if slots is not None else contextlib.nullcontext():
        if on_event:
            on_event("sent", None)
        try:
            send = stream_request if target.stream else whole_request
            sample = await asyncio.wait_for(send(client, target, prompt), timeout=target.timeout_s + 5)
        except TimeoutError:
            sample = RequestSample(
                sent_at=time.perf_counter() - target.timeout_s - 5, ok=False, error="timeout"
            )
    if on_event:
        on_event("done", sample)
    return sample


@dataclass(frozen=True)
class StepResult:
    """The requests sent during one step of a load, with the step's window on the client's clock."""

    rate_rps: float | None
    window: tuple[float, float]
    samples: tuple[RequestSample, ...]
    concurrency: int | None = None


async def run_steps(
    target: Target,
    rates: Sequence[float],
    step_s: float,
    *,
    burstiness: float = 1.0,
    seed: int = 0,
    max_in_flight: int | None = None,
    on_event: OnEvent | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> list[StepResult]:
    """Poisson arrivals at each rate for ``step_s`` seconds, back to back; a single rate is one step."""
    if not rates:
        raise LoadTestError("rates: give at least one rate")
    if step_s <= 0:
        raise LoadTestError(f"step duration = {step_s}: must be > 0 seconds")
    rng = np.random.default_rng(seed)
    slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None
    per_step: list[list[asyncio.Task[RequestSample]]] = []
    windows: list[tuple[float, float]] = []
    async with _client(target) as client:
        start = time.perf_counter()
        for i, rate in enumerate(rates):
            step_start = start + i * step_s
            if on_step:
                on_step(i, rate)
            tasks = []
            for offset in arrival_times(rate, step_s, rng, burstiness):
                delay = step_start + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                prompt = make_prompt(rng, prompt_words(target, rng))
                tasks.append(asyncio.create_task(_guarded(client, target, prompt, slots, on_event)))
            await asyncio.sleep(max(0.0, step_start + step_s - time.perf_counter()))
            per_step.append(tasks)
            windows.append((step_start, step_start + step_s))
        results = []
        for rate, window, tasks in zip(rates, windows, per_step, strict=True):
            samples = await asyncio.gather(*tasks)
            results.append(StepResult(rate_rps=rate, window=window, samples=tuple(samples)))
    return results


async def run_concurrency(
    target: Target, concurrency: int, duration_s: float, *, seed: int = 0, on_event: OnEvent | None = None
) -> StepResult:
    """``concurrency`` clients in closed loop for ``duration_s``: each sends again once answered."""
    if concurrency < 1:
        raise LoadTestError(f"concurrency = {concurrency}: must be >= 1")
    rng = np.random.default_rng(seed)
    samples: list[RequestSample] = []

    async def client_loop(client: httpx.AsyncClient, deadline: float) -> None:
        while time.perf_counter() < deadline:
            prompt = make_prompt(rng, prompt_words(target, rng))
            samples.append(await _guarded(client, target, prompt, None, on_event))

    async with _client(target) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client, start + duration_s) for _ in range(concurrency)))
    return StepResult(
        rate_rps=None, window=(start, start + duration_s), samples=tuple(samples), concurrency=concurrency
    )


class BackgroundLoad:
    """A steady Poisson load in a background thread, for watching what a deploy does to clients.

    ``start()`` begins sending; ``stop()`` stops new arrivals, waits for the in-flight requests and
    returns every sample. ``counts()`` may be read at any time (sent, failed so far).
    """

    def __init__(self, target: Target, rate: float, *, seed: int = 0, burstiness: float = 1.0) -> None:
        if rate <= 0:
            raise LoadTestError(f"rate = {rate}: must be > 0 requests per second")
        self.target, self.rate, self.seed, self.burstiness = target, rate, seed, burstiness
        self._samples: list[RequestSample] = []
        self._sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_at = 0.0
        self.stopped_at = 0.0

    def start(self) -> BackgroundLoad:
        self.started_at = time.perf_counter()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="background-load", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> list[RequestSample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.target.timeout_s + 30)
        self.stopped_at = time.perf_counter()
        with self._lock:
            return list(self._samples)

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self._sent, sum(1 for s in self._samples if not s.ok)

    def samples(self) -> list[RequestSample]:
        """The requests finished so far, in the order they finished (the load goes on)."""
        with self._lock:
            return list(self._samples)

    def _record(self, kind: str, sample: RequestSample | None) -> None:
        with self._lock:
            if kind == "sent":
                self._sent += 1
            elif sample is not None:
                self._samples.append(sample)

    async def _run(self) -> None:
        rng = np.random.default_rng(self.seed)
        tasks: list[asyncio.Task[RequestSample]] = []
        async with _client(self.target) as client:
            next_at = time.perf_counter()
            while not self._stop.is_set():
                next_at += float(rng.gamma(shape=self.burstiness, scale=1.0 / (self.rate * self.burstiness)))
                while not self._stop.is_set() and time.perf_counter() < next_at:
                    await asyncio.sleep(min(0.05, max(0.0, next_at - time.perf_counter())))
                if self._stop.is_set():
                    break
                prompt = make_prompt(rng, prompt_words(self.target, rng))
                tasks.append(asyncio.create_task(_guarded(client, self.target, prompt, None, self._record)))
            await asyncio.gather(*tasks)
