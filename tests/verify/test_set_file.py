"""Reading a verification set: every problem of a file at once, each with its line and field."""

from __future__ import annotations

import pytest

from frontier.verify import VerifySetError, load_set
from tests.verify.harness import MODEL


def _refusal(write_set, text: str) -> str:
    path = write_set(text)
    with pytest.raises(VerifySetError) as caught:
        load_set(path, model=MODEL)
    return str(caught.value).replace(str(path), "set.yaml")


def test_every_problem_of_a_file_is_listed_once_with_its_line(write_set):
    message = _refusal(
        write_set,
        """cases:
  - name: a
    kind: normal
    request: {messages: []}
  - name: b
    kind: vibes
  - name: c
    kind: bad_input
    raw: "["
    expect: {status: 200}
""",
    )
    assert message.splitlines() == [
        "set.yaml: 3 problem(s)",
        "set.yaml:2: cases[0].expect: missing: a case with no expectation checks nothing; say what must come back",
        "set.yaml:6: cases[1].kind = 'vibes': unknown case kind; the kinds are normal, overlong, bad_input, "
        "structured, multi_turn, golden",
        "set.yaml:10: cases[2].expect.status[0] = 200: Input should be greater than or equal to 400",
    ]


def test_two_cases_of_one_name_are_refused(write_set):
    message = _refusal(
        write_set,
        """cases:
  - {name: twice, kind: bad_input, raw: "[", expect: {status: 400}}
  - {name: twice, kind: bad_input, raw: "{", expect: {status: 400}}
""",
    )
    assert message == "set.yaml:3: cases[1].name = 'twice': another case has this name"


def test_a_structured_case_whose_schema_is_not_a_schema_is_refused(write_set):
    message = _refusal(
        write_set,
        """cases:
  - name: s
    kind: structured
    request: {messages: [{role: user, content: hi}]}
    schema: {type: object, properties: {a: {type: 7}}}
""",
    )
    assert message.startswith("set.yaml:5: cases[0].schema: not a valid JSON Schema: 7 is not valid under")


def test_a_file_that_is_not_yaml_is_refused_with_its_line(write_set):
    message = _refusal(write_set, "cases:\n  - name: a\n    kind: [normal\n")
    assert message.startswith("set.yaml:4: not valid YAML: ")
