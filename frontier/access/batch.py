"""Offline batch jobs: an OpenAI Batch-format file through the gateway at batch priority.

Input: one JSON object per line, ``{"custom_id", "method": "POST", "url": "/v1/chat/completions"
| "/v1/completions", "body": {...}}``. Output: one line per input line, in OpenAI's batch output
shape plus the input's line number: ``{"id", "custom_id", "line", "response": {"status_code",
"request_id", "body"}, "error"}``.

Resumable: each result is appended with one ``write`` and ``fsync``ed before the next is counted,
and a restart skips every line that already has a result (a torn last line from a crash is cut
off and its request sent again). So every input line ends with exactly one result. A request that
was in flight when the process died is sent again on restart: the runtime has no way to tell it
already answered, so delivery to the model is at least once while results are exactly once.

A malformed line gets an error result naming its line number, and the rest of the file runs.
Quota refusals (429) and unavailable replicas (502/503/504, connection errors) are retried with
the server's Retry-After or a capped backoff; other answers are results.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from frontier_hostside.names import BATCH, CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, PRIORITY_FIELD

from frontier.errors import FrontierError

ROUTES = (CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH)
RETRYABLE = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class BatchRequest:
    line: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class BadLine:
    line: int
    custom_id: str | None
    message: str


@dataclass
class Summary:
    lines: int = 0
    already_done: int = 0
    succeeded: int = 0
    failed: int = 0
    malformed: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_s: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)  # malformed lines, "line N: why"


def read_input(path: Path, model: str) -> tuple[list[BatchRequest], list[BadLine], int]:
    """The valid requests, the malformed lines, and how many lines the file has."""
    if not path.exists():
        raise FrontierError(f"--input {path}: no such file")
    requests: list[BatchRequest] = []
    bad: list[BadLine] = []
    seen: dict[str, int] = {}
    count = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            count += 1
            parsed = _parse_line(number, text, model, seen)
            (requests if isinstance(parsed, BatchRequest) else bad).append(parsed)
    return requests, bad, count


def _parse_line(number: int, text: str, model: str, seen: dict[str, int]) -> BatchRequest | BadLine:
    try:
        item = json.loads(text)
    except ValueError as exc:
        return BadLine(number, None, f"line {number}: not valid JSON ({exc})")
    if not isinstance(item, dict):
        return BadLine(number, None, f"line {number}: must be a JSON object, got {type(item).__name__}")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BadLine(
            number, None, f"line {number}: custom_id must be a non-empty string, got {custom_id!r}"
        )
    if custom_id in seen:
        return BadLine(
            number,
            custom_id,
            f"line {number}: custom_id {custom_id!r} already used on line {seen[custom_id]}",
        )
    seen[custom_id] = number
    if item.get("method", "POST") != "POST":
        return BadLine(number, custom_id, f"line {number}: method must be POST, got {item.get('method')!r}")
    url = item.get("url")
    if url not in ROUTES:
        return BadLine(
            number, custom_id, f"line {number}: url must be one of {', '.join(ROUTES)}, got {url!r}"
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return BadLine(number, custom_id, f"line {number}: body must be a JSON object")
    if body.get("model", model) != model:
        return BadLine(
            number, custom_id, f"line {number}: body.model {body['model']!r} differs from --model {model!r}"
        )
    if body.get("stream"):
        return BadLine(number, custom_id, f"line {number}: stream must be false in a batch")
    return BatchRequest(number, custom_id, url, {**body, "model": model, PRIORITY_FIELD: BATCH})


class ResultFile:
    """The output file: results appended one ``write`` + ``fsync`` each; knows which lines are done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.done: dict[int, str | None] = {}
        if path.exists():
            self._recover()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _recover(self) -> None:
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            # A crash mid-write: the torn tail is not a result; its line runs again.
            with self.path.open("r+b") as handle:
                handle.truncate(len(complete))
                os.fsync(handle.fileno())
        for n, raw in enumerate(complete.splitlines(), 1):
            try:
                result = json.loads(raw)
                self.done[int(result["line"])] = result.get("custom_id")
            except (ValueError, KeyError, TypeError):
                raise FrontierError(
                    f"--output {self.path}: line {n} is not a result of this tool; choose another file"
                ) from None

    def append(self, result: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(result, separators=(",", ":")) + "\n").encode())
        os.fsync(self._fd)
        self.done[result["line"]] = result.get("custom_id")

    def close(self) -> None:
        os.close(self._fd)


def _result(line: int, custom_id: str | None, response: dict | None, error: dict | None) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "line": line,
        "response": response,
        "error": error,
    }


async def run_batch(
    url: str,
    api_key: str | None,
    requests: list[BatchRequest],
    bad: list[BadLine],
    results: ResultFile,
    *,
    concurrency: int = 8,
    max_attempts: int = 8,
    on_result: Callable[[dict[str, Any]], None] = lambda _: None,
    timeout_s: float = 600.0,
) -> Summary:
    """Send every request without a result yet; write one result per line. Returns the counts."""
    summary = Summary()
    started = time.monotonic()
    for item in bad:
        summary.problems.append(item.message)
        if item.line in results.done:
            continue
        result = _result(item.line, item.custom_id, None, {"code": "invalid_line", "message": item.message})
        results.append(result)
        summary.malformed += 1
        on_result(result)
    by_line = {r.line: r.custom_id for r in requests} | {b.line: b.custom_id for b in bad}
    for line, custom_id in results.done.items():
        expected = by_line.get(line, custom_id)
        if custom_id != expected:
            raise FrontierError(
                f"--output {results.path}: line {line} has custom_id {custom_id!r} but the input says {expected!r}; "
                "the input changed since this output was written"
            )
    todo = [r for r in requests if r.line not in results.done]
    summary.already_done = len(requests) - len(todo)
    queue: asyncio.Queue[BatchRequest] = asyncio.Queue()
    for r in todo:
        queue.put_nowait(r)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                request = queue.get_nowait()
                result = await _send(client, request, max_attempts, summary)
                results.append(result)
                response = result["response"] or {}
                status = response.get("status_code", 0)
                summary.statuses[status] += 1
                if status == 200:
                    summary.succeeded += 1
                    usage = (response.get("body") or {}).get("usage") or {}
                    summary.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                    summary.completion_tokens += int(usage.get("completion_tokens") or 0)
                else:
                    summary.failed += 1
                on_result(result)

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(todo))))))
    summary.lines = len(requests) + len(bad)
    summary.duration_s = time.monotonic() - started
    return summary


async def _send(
    client: httpx.AsyncClient, request: BatchRequest, max_attempts: int, summary: Summary
) -> dict[str, Any]:
    error: dict[str, Any] | None = None
    for attempt in range(max_attempts):
        if attempt:
            summary.retries += 1
        try:
            answer = await client.post(request.url, json=request.body)
        except httpx.TransportError as exc:
            error = {"code": "connection_error", "message": f"{type(exc).__name__}: {exc}"}
            await asyncio.sleep(_backoff(attempt))
            continue
        if answer.status_code in RETRYABLE and attempt < max_attempts - 1:
            await asyncio.sleep(_retry_after(answer, attempt))
            continue
        try:
            body = answer.json()
        except ValueError:
            body = {"text": answer.text[:2000]}
        response = {
            "status_code": answer.status_code,
            "request_id": answer.headers.get("x-request-id", ""),
            "body": body,
        }
        return _result(
            request.line,
            request.custom_id,
            response,
            None if answer.status_code == 200 else body.get("error"),
        )
    return _result(request.line, request.custom_id, None, error)


def _backoff(attempt: int) -> float:
    return min(30.0, 0.25 * 2**attempt) * (0.5 + random.random() / 2)


def _retry_after(answer: httpx.Response, attempt: int) -> float:
    try:
        return min(60.0, max(0.1, float(answer.headers["retry-after"])))
    except (KeyError, ValueError):
        return _backoff(attempt)
