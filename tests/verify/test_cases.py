"""Each case kind against a real runtime over a real socket: a case that should pass passes, and a
case whose expectation the answer does not meet fails with the reason named."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from frontier.verify import CaseResult, load_set, run_set
from frontier.verify.cases import KINDS
from tests.gateway.harness import RuntimeProcess
from tests.verify.harness import CONTEXT, MODEL, url_of


def _run(runtime: RuntimeProcess, write_set: Callable[[str], Path], text: str) -> CaseResult:
    verify_set = load_set(write_set(text), model=MODEL)
    report = run_set(runtime.url, None, verify_set, model=MODEL, context_tokens=CONTEXT)
    assert len(report.results) == 1
    return report.results[0]


def test_a_normal_case_passes_when_answered_in_shape_with_consistent_usage(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: chat
    kind: normal
    request: {messages: [{role: user, content: hello}], max_tokens: 8, temperature: 0}
    expect:
      fields: [id, choices.0.message.role, usage.total_tokens]
      finish_reason: [stop, length]
      usage: true
""",
    )
    assert result.passed, result.why


def test_a_normal_case_fails_naming_the_finish_reason_it_got(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: must-stop
    kind: normal
    route: completions
    request: {prompt: hello, max_tokens: 2, ignore_eos: true}
    expect: {finish_reason: [stop]}
""",
    )
    assert not result.passed
    assert result.why == "finish_reason 'length', expected one of stop"


def test_a_normal_case_fails_on_a_field_the_body_lacks(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: wants-a-field
    kind: normal
    request: {messages: [{role: user, content: hello}], max_tokens: 2}
    expect: {fields: [system_fingerprint_of_nothing]}
""",
    )
    assert not result.passed
    assert result.why == "fields missing: system_fingerprint_of_nothing"


def test_an_overlong_prompt_passes_when_refused_with_the_context_named(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: too-long
    kind: overlong
    route: completions
    expect: {status: 400, message_contains: [maximum context length, "512"]}
""",
    )
    assert result.passed, result.why


def test_an_overlong_case_fails_when_the_message_lacks_its_words(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: wrong-words
    kind: overlong
    over: max_tokens
    expect: {status: 400, message_contains: [truncated]}
""",
    )
    assert not result.passed
    assert result.why.startswith("message lacks 'truncated': \"This model's maximum context length is 512")


def test_bad_input_passes_when_refused_with_its_words(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: not-json
    kind: bad_input
    raw: '{"messages": '
    expect: {status: 400, message_contains: [not valid JSON]}
""",
    )
    assert result.passed, result.why


def test_bad_input_fails_when_the_body_is_answered(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: not-bad-at-all
    kind: bad_input
    request: {messages: [{role: user, content: hi}], max_tokens: 1}
    expect: {status: [400, 422]}
""",
    )
    assert not result.passed
    assert result.why == "status 200, expected 400 or 422: answered"


def test_structured_output_passes_when_it_parses_and_validates(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: json
    kind: structured
    request: {messages: [{role: user, content: a host}], max_tokens: 120, temperature: 0}
    schema:
      type: object
      properties: {name: {type: string, maxLength: 8}, up: {type: boolean}}
      required: [name, up]
      additionalProperties: false
""",
    )
    assert result.passed, result.why


def test_structured_output_cut_short_fails_as_not_json(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: cut-short
    kind: structured
    route: completions
    request: {prompt: a host, max_tokens: 3, temperature: 0}
    schema:
      type: object
      properties: {name: {type: string, maxLength: 8}, up: {type: boolean}}
      required: [name, up]
""",
    )
    assert not result.passed
    assert result.why.startswith("output is not JSON (") and "finish_reason 'length'" in result.why


def test_a_conversation_is_answered_with_every_earlier_turn_in_the_prompt(runtime, write_set):
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: talk
    kind: multi_turn
    system: be brief
    turns: [my name is Ada, "what is my name?"]
    params: {max_tokens: 6, temperature: 0}
    expect: {finish_reason: [stop, length], usage: true}
""",
    )
    assert result.passed, result.why
    assert result.why.startswith("2 turns answered, last prompt ")


def test_a_conversation_fails_on_the_turn_that_breaks_its_expectation(runtime, write_set):
    # A random model does not remember the name: the expectation of the last turn fails there.
    result = _run(
        runtime,
        write_set,
        """
cases:
  - name: remembers
    kind: multi_turn
    turns: [my name is Ada, "what is my name?"]
    params: {max_tokens: 6, temperature: 0}
    expect: {contains: [Ada]}
""",
    )
    assert not result.passed
    assert result.why.startswith("turn 2: content lacks 'Ada'")


def test_the_report_counts_cases_per_kind(runtime, write_set):
    verify_set = load_set(
        write_set(
            """
cases:
  - {name: a, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 1}, expect: {status: 200}}
  - {name: b, kind: bad_input, raw: "[", expect: {status: 400}}
  - {name: c, kind: bad_input, raw: "[", expect: {status: 413}}
"""
        ),
        model=MODEL,
    )
    report = run_set(runtime.url, None, verify_set, model=MODEL, context_tokens=CONTEXT)
    summaries = {s.kind: (s.cases, s.passed, s.failed, [r.name for r in s.failing]) for s in report.by_kind()}
    assert summaries == {"normal": (1, 1, 0, []), "bad_input": (2, 1, 1, ["c"])}
    assert report.pass_rate == 2 / 3
    assert set(summaries) < set(KINDS)


def test_an_endpoint_that_does_not_answer_fails_every_case_with_the_reason(write_set, listener):
    url = url_of(listener)
    listener.close()  # nothing listens there any more: connections are refused
    verify_set = load_set(
        write_set("cases:\n  - {name: a, kind: normal, request: {messages: []}, expect: {status: 200}}\n"),
        model=MODEL,
    )
    report = run_set(url, None, verify_set, model=MODEL, context_tokens=CONTEXT, timeout_s=2)
    assert report.pass_rate == 0
    assert report.results[0].why.startswith("status 0, expected 200: no response: ConnectError")
