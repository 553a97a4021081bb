"""The demo's migration: one long greedy stream through the gateway whose replica gets a notice
mid-stream (``POST /admin/replicas/interrupt`` on the gateway's admin port, what a spot notice
handler calls). The stream carries on at the pool's other replica from the tokens it had; the demo
prints how many tokens came before and after, the gateway's migration count and the stall, and
checks the text against the same request run uninterrupted.

The interrupted runtime is not stopped: the gateway takes it out of rotation and its next
readiness probe brings it back, so the rest of the demo runs on an unchanged stack.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from frontier_hostside import names

from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.loadtest.stats import RequestSample
from frontier.targets.local.gateway import gateway_url

MAX_TOKENS = 240
NOTICE_AFTER = 24  # tokens the client has when the replica gets its notice


@dataclass
class Stream:
    """One streamed completion as its client saw it: the replica that answered (its header), the
    text, when each token arrived, and what went wrong."""

    sent_at: float = 0.0
    replica: str = ""
    text: str = ""
    arrivals: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: bool = False

    def sample(self) -> RequestSample:
        ok = self.done and not self.errors
        ends = self.arrivals or [self.sent_at]
        return RequestSample(
            sent_at=self.sent_at,
            ok=ok,
            error=None if ok else "; ".join(self.errors) or "the stream did not finish",
            ttft_s=(self.arrivals[0] - self.sent_at) if self.arrivals else None,
            e2el_s=ends[-1] - self.sent_at,
            output_tokens=len(self.arrivals),
        )


@dataclass
class MigrationRun:
    sample: RequestSample
    migrations: float
    stall_s: float


def greedy(model: str, prompt: str, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    """A streamed greedy completion of ``max_tokens``: the same text wherever it is computed."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


def stream(url: str, key: str, body: dict[str, Any], into: Stream, timeout_s: float = 60) -> Stream:
    """Send ``body`` to the completions endpoint at ``url`` and record each token into ``into`` as it
    arrives (a thread's target: the caller reads ``into`` while it fills)."""
    into.sent_at = time.monotonic()
    try:
        with httpx.stream(
            "POST",
            url + names.COMPLETIONS_PATH,
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout_s,
        ) as answer:
            into.replica = answer.headers.get(names.REPLICA_HEADER, "")
            if answer.status_code != 200:
                into.errors.append(f"HTTP {answer.status_code}: {answer.read()[:200]!r}")
                return into
            for line in answer.iter_lines():
                if line == "data: [DONE]":
                    into.done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        into.errors.append(str(event["error"].get("message")))
                    for choice in event.get("choices") or ():
                        into.text += choice.get("text") or ""
                        into.arrivals.append(time.monotonic())
    except httpx.HTTPError as exc:
        into.errors.append(repr(exc))
    return into


def metric(admin: str, name: str) -> float:
    """The sum of the gateway's series ``name`` on its admin port."""
    text = httpx.get(admin + names.METRICS_PATH, timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def replica_urls(admin: str) -> dict[str, str]:
    """The gateway's replicas: the id clients see (its header) -> the base URL it reaches (the
    breaker gauge maps them)."""
    text = httpx.get(admin + names.METRICS_PATH, timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith(names.GATEWAY_REPLICA_BREAKER_METRIC + "{"):
            replica_id = line.split('replica_id="', 1)[1].split('"', 1)[0]
            found[replica_id] = line.split('replica="', 1)[1].split('"', 1)[0]
    return found


def demo_part(multi: Settings, model: str, key: str, say: Callable[[str], None]) -> MigrationRun:
    """One stream moved by a notice to its replica; its text equals the uninterrupted run's."""
    assert multi.gateway is not None
    url = gateway_url(multi)
    admin = f"http://{multi.gateway.admin_host}:{multi.gateway.admin_port}"
    prompt = "The migration demo: a long story told one token at a time"
    body = greedy(model, prompt)
    reference = stream(url, key, body, Stream())
    if not reference.done or reference.errors:
        raise FrontierError(f"the uninterrupted stream failed: {reference.errors}")
    before = metric(admin, names.GATEWAY_MIGRATIONS_METRIC + "_total")
    moved = Stream()
    worker = threading.Thread(target=stream, args=(url, key, body, moved), daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while len(moved.arrivals) < NOTICE_AFTER and worker.is_alive():
        if time.monotonic() > deadline:
            raise FrontierError("the stream sent no tokens within 60 s")
        time.sleep(0.005)
    at_notice = len(moved.arrivals)
    noticed_at = time.monotonic()
    replica = replica_urls(admin).get(moved.replica)
    if replica is None:
        raise FrontierError(f"the gateway's metrics name no replica with id {moved.replica!r}")
    answer = httpx.post(admin + names.GATEWAY_INTERRUPT_PATH, json={"replica": replica}, timeout=10)
    answer.raise_for_status()
    worker.join(120)
    migrations = metric(admin, names.GATEWAY_MIGRATIONS_METRIC + "_total") - before
    gaps = [b - a for a, b in zip(moved.arrivals, moved.arrivals[1:], strict=False) if b > noticed_at]
    stall = max(gaps) if gaps else 0.0
    same = moved.text == reference.text
    say(
        f"notice to {replica} after {at_notice} of {MAX_TOKENS} tokens: migrations={migrations:.0f}, "
        f"{len(moved.arrivals) - at_notice} tokens from another replica, stall {stall * 1000:.0f} ms, "
        f"errors {len(moved.errors)}, text equal to the uninterrupted run: {'yes' if same else 'NO'}"
    )
    if not same and not moved.errors:
        moved.errors.append("the migrated stream's text differs from the uninterrupted run's")
    return MigrationRun(moved.sample(), migrations, stall)
