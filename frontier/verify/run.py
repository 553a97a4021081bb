"""Run a verification set against an OpenAI-compatible endpoint, one case after another.

Cases run in order on one connection, so a run is repeatable and a canary's verification never
competes with itself for the replica it judges. A case that cannot be sent (connection refused,
timeout) fails with the reason; the run goes on to the next.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
import time
from collections.abc import Callable
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from jsonschema.validators import validator_for
from pydantic import BaseModel

from frontier.errors import FrontierError
from frontier.verify.cases import (
    BadInputCase,
    Case,
    ErrorExpectation,
    GoldenCase,
    GoldenFile,
    GoldenOutput,
    MultiTurnCase,
    NormalCase,
    OverlongCase,
    ResponseExpectation,
    Route,
    StructuredCase,
    VerifySet,
)
from frontier.verify.report import CaseResult, VerifyReport

PATHS: dict[Route, str] = {"chat": "/chat/completions", "completions": "/completions"}


class RecordError(FrontierError):
    """A golden case the reference release did not answer: there is nothing to record."""


class Reply(BaseModel):
    """What came back for one request: the status (0 when nothing did), the JSON body if any."""

    status: int
    body: Any = None
    text: str = ""

    def error_message(self) -> str:
        if isinstance(self.body, dict):
            error = self.body.get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return str(error["message"])
            for key in ("message", "detail"):
                if isinstance(self.body.get(key), str):
                    return str(self.body[key])
        return self.text[:300]


class Outcome(BaseModel):
    passed: bool
    why: str
    unrecorded: bool = False


#: What a golden case with nothing to compare with says in the report.
NOT_RECORDED = "not yet recorded — run `fab verify --record`"


def run_set(
    endpoint: str,
    key: str | None,
    verify_set: VerifySet,
    *,
    model: str,
    context_tokens: int,
    timeout_s: float = 120.0,
    on_result: Callable[[CaseResult], None] | None = None,
) -> VerifyReport:
    """Every case of ``verify_set`` against ``endpoint`` (a base URL, with or without ``/v1``),
    with requests for ``model`` whose context holds ``context_tokens``."""
    results = []
    with _client(endpoint, key, timeout_s) as client:
        for case in verify_set.cases:
            started = time.monotonic()
            outcome = _run_case(client, case, model, context_tokens, verify_set.golden)
            result = CaseResult(
                name=case.name,
                kind=case.kind,
                passed=outcome.passed,
                why=outcome.why,
                seconds=time.monotonic() - started,
                unrecorded=outcome.unrecorded,
            )
            results.append(result)
            if on_result is not None:
                on_result(result)
    return VerifyReport(endpoint=endpoint, model=model, source=verify_set.source, results=tuple(results))


def record_golden(
    endpoint: str, key: str | None, verify_set: VerifySet, *, model: str, timeout_s: float = 120.0
) -> dict[str, GoldenOutput]:
    """The greedy output of every golden case, from the release ``endpoint`` serves now."""
    outputs = {}
    with _client(endpoint, key, timeout_s) as client:
        for case in verify_set.cases:
            if isinstance(case, GoldenCase):
                reply = _send(client, case.route, _golden_body(case, model))
                output = _golden_output(reply, case.route)
                if output is None:
                    raise RecordError(
                        f"golden case {case.name!r}: status {reply.status}, not an answer to record: "
                        f"{reply.error_message() or reply.text[:200]}"
                    )
                outputs[case.name] = output
    return outputs


def _client(endpoint: str, key: str | None, timeout_s: float) -> httpx.Client:
    base = endpoint.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=base, headers=headers, timeout=timeout_s)


def _send(client: httpx.Client, route: Route, body: Any, *, raw: str | None = None) -> Reply:
    try:
        if raw is not None:
            response = client.post(
                PATHS[route], content=raw.encode(), headers={"Content-Type": "application/json"}
            )
        else:
            response = client.post(PATHS[route], json=body)
    except httpx.HTTPError as exc:
        return Reply(status=0, text=f"no response: {type(exc).__name__}: {exc}")
    try:
        parsed = response.json()
    except ValueError:
        parsed = None
    return Reply(status=response.status_code, body=parsed, text=response.text)


def _run_case(
    client: httpx.Client, case: Case, model: str, context_tokens: int, golden: GoldenFile | None
) -> Outcome:
    if isinstance(case, NormalCase):
        body = {"model": model, **case.request}
        return _check_answer(_send(client, case.route, body), case.route, case.expect, body)
    if isinstance(case, OverlongCase):
        return _check_refusal(
            _send(client, case.route, _overlong_body(case, model, context_tokens)), case.expect
        )
    if isinstance(case, BadInputCase):
        sent = None if case.request is None else {"model": model, **case.request}
        return _check_refusal(_send(client, case.route, sent, raw=case.raw), case.expect)
    if isinstance(case, StructuredCase):
        return _run_structured(client, case, model)
    if isinstance(case, MultiTurnCase):
        return _run_multi_turn(client, case, model)
    want = golden.outputs.get(case.name) if golden is not None else None
    if golden is None or want is None:
        # Nothing to compare with is not a wrong answer: the case is left out of the pass rate.
        return Outcome(passed=False, why=NOT_RECORDED, unrecorded=True)
    return _check_golden(
        _send(client, case.route, _golden_body(case, model)), case.route, want, golden.release
    )


# -- answers ---------------------------------------------------------------------------------------


def _check_answer(reply: Reply, route: Route, expect: ResponseExpectation, body: dict[str, Any]) -> Outcome:
    """The status, the OpenAI shape, and every check ``expect`` names."""
    if reply.status != expect.status:
        return _fail(f"status {reply.status}, expected {expect.status}: {reply.error_message()}")
    choice, content, problem = _first_choice(reply, route)
    if problem:
        return _fail(problem)
    missing = [path for path in expect.fields if not _has(reply.body, path)]
    if missing:
        return _fail(f"fields missing: {', '.join(missing)}")
    finish = choice.get("finish_reason")
    if expect.finish_reason and finish not in expect.finish_reason:
        return _fail(f"finish_reason {finish!r}, expected one of {', '.join(expect.finish_reason)}")
    if expect.non_empty and not content.strip():
        return _fail(f"empty content (finish_reason {finish!r})")
    if expect.usage and (problem := _usage_problem(reply.body.get("usage"), body.get("max_tokens"))):
        return _fail(problem)
    absent = [word for word in expect.contains if word.lower() not in content.lower()]
    if absent:
        return _fail(f"content lacks {', '.join(map(repr, absent))}: {content[:120]!r}")
    usage = reply.body.get("usage") or {}
    return Outcome(passed=True, why=f"{reply.status}, {finish}, {_tokens(usage.get('completion_tokens'))}")


def _first_choice(reply: Reply, route: Route) -> tuple[dict[str, Any], str, str]:
    """The first choice and its text, or a problem saying what of the OpenAI shape is missing."""
    body = reply.body
    if not isinstance(body, dict):
        return {}, "", f"body is not a JSON object: {reply.text[:120]!r}"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return {}, "", "no choices in the body"
    choice = choices[0]
    holder = choice.get("message") if route == "chat" else choice
    field = "message.content" if route == "chat" else "text"
    content = holder.get("content" if route == "chat" else "text") if isinstance(holder, dict) else None
    if not isinstance(content, str):
        return choice, "", f"choices[0].{field} is not text: {content!r}"
    if "finish_reason" not in choice:
        return choice, content, "choices[0].finish_reason missing"
    return choice, content, ""


def _usage_problem(usage: Any, max_tokens: Any) -> str:
    if not isinstance(usage, dict):
        return "usage missing"
    prompt, completion, total = (usage.get(n) for n in ("prompt_tokens", "completion_tokens", "total_tokens"))
    if not (isinstance(prompt, int) and isinstance(completion, int) and isinstance(total, int)):
        return f"usage counts are not integers: {usage}"
    if total != prompt + completion:
        return f"usage total_tokens {total} != prompt {prompt} + completion {completion}"
    if prompt < 1:
        return f"usage prompt_tokens {prompt}: a prompt has at least one token"
    if isinstance(max_tokens, int) and completion > max_tokens:
        return f"usage completion_tokens {completion} > max_tokens {max_tokens}"
    return ""


def _has(body: Any, path: str) -> bool:
    at = body
    for part in path.split("."):
        if isinstance(at, dict) and part in at:
            at = at[part]
        elif isinstance(at, list) and part.isdigit() and int(part) < len(at):
            at = at[int(part)]
        else:
            return False
    return True


# -- refusals --------------------------------------------------------------------------------------


def _overlong_body(case: OverlongCase, model: str, context_tokens: int) -> dict[str, Any]:
    # Each filler repetition is one token or more, so n repetitions are at least n tokens.
    n = math.ceil(case.factor * context_tokens)
    text, extra = (case.filler * n, {}) if case.over == "prompt" else ("Hello", {"max_tokens": n})
    if case.route == "chat":
        return {"model": model, "messages": [{"role": "user", "content": text}], **extra}
    return {"model": model, "prompt": text, **extra}


def _check_refusal(reply: Reply, expect: ErrorExpectation) -> Outcome:
    allowed = " or ".join(map(str, expect.status))
    message = reply.error_message()
    if reply.status not in expect.status:
        said = "answered" if 200 <= reply.status < 300 else message[:160]
        return _fail(f"status {reply.status}, expected {allowed}: {said}")
    absent = [word for word in expect.message_contains if word.lower() not in message.lower()]
    if absent:
        return _fail(f"message lacks {', '.join(map(repr, absent))}: {message[:160]!r}")
    return Outcome(passed=True, why=f"{reply.status}: {textwrap.shorten(message, 72, placeholder=' …')}")


# -- structured output -----------------------------------------------------------------------------


def _run_structured(client: httpx.Client, case: StructuredCase, model: str) -> Outcome:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", case.name)[:64]
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": case.schema_, "strict": True},
    }
    body = {"model": model, **case.request, "response_format": response_format}
    reply = _send(client, case.route, body)
    answered = _check_answer(reply, case.route, case.expect, body)
    if not answered.passed:
        return answered
    _, content, _ = _first_choice(reply, case.route)
    try:
        value = json.loads(content)
    except json.JSONDecodeError as exc:
        finish = reply.body["choices"][0].get("finish_reason")
        return _fail(f"output is not JSON ({exc.msg}, finish_reason {finish!r}): {content[:80]!r}")
    validator: Draft202012Validator = validator_for(case.schema_)(case.schema_)
    error = next(iter(validator.iter_errors(value)), None)
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "(top)"
        return _fail(f"output does not match the schema at {where}: {error.message}")
    return Outcome(passed=True, why=f"valid JSON, {len(content)} chars")


# -- conversations ---------------------------------------------------------------------------------


def _run_multi_turn(client: httpx.Client, case: MultiTurnCase, model: str) -> Outcome:
    """Each turn carries the conversation so far; the last turn's prompt must be longer than the
    one before it, or the earlier turns were not part of it."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": case.system}] if case.system else []
    prompt_tokens = 0
    for number, turn in enumerate(case.turns, start=1):
        messages.append({"role": "user", "content": turn})
        body = {"model": model, **case.params, "messages": list(messages)}
        reply = _send(client, "chat", body)
        last = number == len(case.turns)
        if last:
            outcome = _check_answer(reply, "chat", case.expect, body)
            if not outcome.passed:
                return _fail(f"turn {number}: {outcome.why}")
        elif reply.status != 200:
            return _fail(f"turn {number}: status {reply.status}: {reply.error_message()}")
        _, content, problem = _first_choice(reply, "chat")
        if problem:
            return _fail(f"turn {number}: {problem}")
        grown = _prompt_tokens(reply)
        if grown is not None and number > 1 and grown <= prompt_tokens:
            return _fail(f"turn {number}: prompt of {grown} tokens, no longer than turn {number - 1}'s")
        prompt_tokens = grown or 0
        messages.append({"role": "assistant", "content": content})
    return Outcome(passed=True, why=f"{len(case.turns)} turns answered, last prompt {prompt_tokens} tokens")


def _prompt_tokens(reply: Reply) -> int | None:
    usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


# -- golden outputs --------------------------------------------------------------------------------


def _golden_body(case: GoldenCase, model: str) -> dict[str, Any]:
    # Greedy, and with the tokens themselves (logprobs) so a difference is found where it starts.
    tokens: dict[str, Any] = {"logprobs": True} if case.route == "chat" else {"logprobs": 0}
    return {"model": model, **case.request, "temperature": 0, **tokens}


def _golden_output(reply: Reply, route: Route) -> GoldenOutput | None:
    if reply.status != 200:
        return None
    choice, content, problem = _first_choice(reply, route)
    if problem:
        return None
    logprobs = choice.get("logprobs")
    tokens = None
    if isinstance(logprobs, dict) and route == "chat" and isinstance(logprobs.get("content"), list):
        tokens = tuple(str(entry.get("token")) for entry in logprobs["content"])
    elif isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        tokens = tuple(map(str, logprobs["tokens"]))
    return GoldenOutput(text=content, tokens=tokens, finish_reason=choice.get("finish_reason"))


def _check_golden(reply: Reply, route: Route, want: GoldenOutput, release: str) -> Outcome:
    got = _golden_output(reply, route)
    if got is None:
        return _fail(f"status {reply.status}: {reply.error_message()}")
    if got.tokens is not None and want.tokens is not None and got.tokens != want.tokens:
        at = next((i for i, (a, b) in enumerate(zip(got.tokens, want.tokens, strict=False)) if a != b), None)
        if at is None:
            at = min(len(got.tokens), len(want.tokens))
            return _fail(
                f"{len(got.tokens)} tokens where release {release} gave {len(want.tokens)} (same up to token {at})"
            )
        return _fail(
            f"token {at}: {_token(got.tokens, at)} where release {release} gave {_token(want.tokens, at)}"
        )
    if got.text != want.text:
        return _fail(f"text differs from release {release}: {got.text[:60]!r} vs {want.text[:60]!r}")
    if got.finish_reason != want.finish_reason:
        return _fail(
            f"finish_reason {got.finish_reason!r} where release {release} gave {want.finish_reason!r}"
        )
    count = _tokens(len(got.tokens)) if got.tokens is not None else f"{len(got.text)} chars"
    return Outcome(passed=True, why=f"equal to release {release} ({count})")


def _token(tokens: tuple[str, ...], at: int) -> str:
    return repr(tokens[at]) if at < len(tokens) else "(end)"


def _tokens(count: object) -> str:
    return "1 token" if count == 1 else f"{count if isinstance(count, int) else '?'} tokens"


def _fail(why: str) -> Outcome:
    return Outcome(passed=False, why=why)
