"""Offline batch jobs: an OpenAI Batch-format file through the gateway at batch priority.

Input: one JSON object per line, ``{"custom_id", "method": "POST", "url": "/v1/chat/completions"
| "/v1/completions", "body": {...}}``. Output: one line per input line, in OpenAI's batch output
shape plus the input's line number: ``{"id", "custom_id", "line", "response": {"status_code",
"request_id", "body"}, "error"}``.

Resumable: each result is appended with one ``write`` and ``fsync``ed before the next is counted,
and a restart skips every line whose result is a success (a torn last line from a crash is cut
off and its request sent again). A request that was in flight when the process died is sent again
on restart: the runtime has no way to tell it already answered, so delivery to the model is at
least once while results are exactly once.

A failed line keeps its result, and a plain rerun reports it without sending it again: whether to
resend is the operator's call (:class:`RetryPolicy`). ``--retry-failed`` resends the lines a retry
can fix (429, 408, 5xx, no answer at all: a refused connection or a timeout); a client error (400,
401, 422, ...) says the line or the key is wrong and is resent only when its status is named
(``--retry-status``), after the cause is fixed. A resent line's old result is removed from the file first (an atomic rewrite),
so the file still holds one result per line.

A malformed line gets an error result naming its line number, and the rest of the file runs; a
line fixed in the input since is sent on the next run. Within one run, quota refusals (429) and
unavailable replicas (502/503/504, connection errors) are retried with the server's Retry-After
or a capped backoff; other answers are results.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from frontier_hostside.names import BATCH, CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, PRIORITY_FIELD

from frontier.errors import FrontierError

ROUTES = (CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH)
#: Answers retried within one run: the gateway's quota or a replica is busy or leaving.
RETRYABLE = frozenset({429, 502, 503, 504})
#: Statuses a later run may resend with ``retry_failed``: waiting can change them (5xx too).
RETRY_LATER = frozenset({408, 429})
INVALID_LINE = "invalid_line"


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


@dataclass(frozen=True)
class Recorded:
    """What the output file says of one input line: its latest result."""

    line: int
    custom_id: str | None
    #: The HTTP status; None where no answer came (refused connection, timeout) or the line was malformed.
    status: int | None
    #: The result's ``error.code`` (``invalid_line``, ``connection_error``, ``timeout``, the server's).
    error_code: str | None

    @property
    def succeeded(self) -> bool:
        return self.status == 200

    @property
    def malformed(self) -> bool:
        return self.status is None and self.error_code == INVALID_LINE

    @property
    def retryable(self) -> bool:
        """Whether resending can fix it: the server was busy, broken or unreachable, not the line."""
        if self.status is None:
            return not self.malformed
        return self.status in RETRY_LATER or self.status >= 500

    @property
    def outcome(self) -> str:
        """``ok``, ``malformed`` or ``failed``: what a progress line counts."""
        return "ok" if self.succeeded else "malformed" if self.malformed else "failed"

    @property
    def reason(self) -> str:
        """How it failed, as the summary groups lines: ``HTTP 401``, ``connection_error``, ``timeout``."""
        if self.status is not None:
            return f"HTTP {self.status}"
        return self.error_code or "no answer"

    @classmethod
    def of(cls, result: dict[str, Any]) -> Recorded:
        response = result.get("response") or {}
        error = result.get("error") or {}
        status = response.get("status_code")
        return cls(
            int(result["line"]),
            result.get("custom_id"),
            int(status) if status is not None else None,
            error.get("code") if isinstance(error, dict) else None,
        )


@dataclass(frozen=True)
class RetryPolicy:
    """Which earlier failures a run sends again (never a success)."""

    #: ``--retry-failed``: the failures a retry can fix (429, 408, 5xx, no answer).
    failed: bool = False
    #: ``--retry-status``: client errors to resend too, once their cause is fixed (a key, a body).
    statuses: frozenset[int] = frozenset()

    def resends(self, recorded: Recorded) -> bool:
        if recorded.succeeded or recorded.malformed:
            return False
        return (self.failed and recorded.retryable) or recorded.status in self.statuses


@dataclass
class Summary:
    lines: int = 0
    #: Lines that succeeded in an earlier run: skipped.
    already_done: int = 0
    succeeded: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_s: float = 0.0
    #: Lines that failed in this run, by reason (``HTTP 401``, ``timeout``, ...).
    failures: dict[str, list[int]] = field(default_factory=dict)
    #: Lines that failed in an earlier run and were not resent (see :class:`RetryPolicy`), by reason.
    not_retried: dict[str, list[int]] = field(default_factory=dict)
    #: The reasons among ``not_retried`` that ``retry_failed`` would resend.
    resendable: set[str] = field(default_factory=set)
    #: Malformed lines of the input, every run (they have nothing to send).
    bad_lines: list[BadLine] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(len(lines) for lines in self.failures.values())

    @property
    def left_failed(self) -> int:
        return sum(len(lines) for lines in self.not_retried.values())

    @property
    def malformed(self) -> int:
        return len(self.bad_lines)

    @property
    def problems(self) -> list[str]:
        return [b.message for b in self.bad_lines]


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
            if isinstance(parsed, BatchRequest):
                requests.append(parsed)
            else:
                bad.append(parsed)
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
    """The output file: results appended one ``write`` + ``fsync`` each; knows each line's latest result."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.recorded: dict[int, Recorded] = {}
        if path.exists():
            self._recover()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def done(self) -> set[int]:
        """The lines that succeeded: never sent again."""
        return {line for line, r in self.recorded.items() if r.succeeded}

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
                self._note(Recorded.of(json.loads(raw)))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise FrontierError(
                    f"--output {self.path}: line {n} is not a result of this tool; choose another file"
                ) from None

    def _note(self, recorded: Recorded) -> None:
        # A success stands: nothing written after it (by an older version of this file) replaces it.
        earlier = self.recorded.get(recorded.line)
        if earlier is None or not earlier.succeeded:
            self.recorded[recorded.line] = recorded

    def append(self, result: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(result, separators=(",", ":")) + "\n").encode())
        os.fsync(self._fd)
        self._note(Recorded.of(result))

    def forget(self, lines: set[int]) -> None:
        """Remove these lines' results, so each resent line ends with one result. The file is
        rewritten beside itself and renamed over: a crash leaves the old file or the new one."""
        if not lines:
            return
        kept = [
            raw
            for raw in self.path.read_bytes().splitlines(keepends=True)
            if int(json.loads(raw)["line"]) not in lines
        ]
        fresh = self.path.with_name(self.path.name + ".rewrite")
        with fresh.open("wb") as handle:
            handle.writelines(kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.close(self._fd)
        os.replace(fresh, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        for line in lines:
            self.recorded.pop(line, None)

    def close(self) -> None:
        os.close(self._fd)


def _result(
    line: int, custom_id: str | None, response: dict[str, Any] | None, error: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "line": line,
        "response": response,
        "error": error,
    }


def _add(groups: dict[str, list[int]], reason: str, line: int) -> None:
    groups.setdefault(reason, []).append(line)


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
    on_start: Callable[[int], None] = lambda _: None,
    timeout_s: float = 600.0,
    retry: RetryPolicy = RetryPolicy(),
) -> Summary:
    """Send every request that has no result yet (and the earlier failures ``retry`` names);
    write one result per line. ``on_start`` hears how many results this run will write, before
    the first; ``on_result`` hears each. Returns the counts."""
    summary = Summary(lines=len(requests) + len(bad), bad_lines=sorted(bad, key=lambda b: b.line))
    started = time.monotonic()
    by_line = {r.line: r.custom_id for r in requests} | {b.line: b.custom_id for b in bad}
    for line, recorded in results.recorded.items():
        expected = by_line.get(line, recorded.custom_id)
        if not recorded.malformed and recorded.custom_id != expected:
            raise FrontierError(
                f"--output {results.path}: line {line} has custom_id {recorded.custom_id!r} but the input says "
                f"{expected!r}; the input changed since this output was written"
            )
    todo: list[BatchRequest] = []
    resend: set[int] = set()
    for request in requests:
        earlier = results.recorded.get(request.line)
        if earlier is None:
            todo.append(request)
        elif earlier.succeeded:
            summary.already_done += 1
        elif earlier.malformed or retry.resends(earlier):
            # Malformed then, fixed in the input since; or a failure this run was asked to resend.
            todo.append(request)
            resend.add(request.line)
        else:
            _add(summary.not_retried, earlier.reason, request.line)
            if earlier.retryable:
                summary.resendable.add(earlier.reason)
    for item in bad:
        if item.line in results.recorded and not results.recorded[item.line].malformed:
            raise FrontierError(
                f"--output {results.path}: line {item.line} was sent in an earlier run but is malformed now "
                f"({item.message}); the input changed since this output was written"
            )
    results.forget(resend)
    fresh_bad = [item for item in bad if item.line not in results.recorded]
    on_start(len(todo) + len(fresh_bad))
    for item in fresh_bad:
        result = _result(item.line, item.custom_id, None, {"code": INVALID_LINE, "message": item.message})
        results.append(result)
        on_result(result)
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
                recorded = Recorded.of(result)
                if recorded.succeeded:
                    summary.succeeded += 1
                    usage = (result["response"].get("body") or {}).get("usage") or {}
                    summary.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                    summary.completion_tokens += int(usage.get("completion_tokens") or 0)
                else:
                    _add(summary.failures, recorded.reason, request.line)
                on_result(result)

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(todo))))))
    for groups in (summary.failures, summary.not_retried):
        for lines in groups.values():
            lines.sort()
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
            code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_error"
            error = {"code": code, "message": f"{type(exc).__name__}: {exc}"}
            if attempt < max_attempts - 1:
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
        error = None
        if answer.status_code != 200:
            found = body.get("error") if isinstance(body, dict) else None
            error = (
                found
                if isinstance(found, dict)
                else {"code": f"http_{answer.status_code}", "message": str(found)}
            )
        return _result(request.line, request.custom_id, response, error)
    return _result(request.line, request.custom_id, None, error)


def _backoff(attempt: int) -> float:
    delay: float = min(30.0, 0.25 * 2**attempt) * (0.5 + random.random() / 2)
    return delay


def _retry_after(answer: httpx.Response, attempt: int) -> float:
    try:
        return min(60.0, max(0.1, float(answer.headers["retry-after"])))
    except (KeyError, ValueError):
        return _backoff(attempt)
