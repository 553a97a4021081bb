"""``fab verify`` as a user types it: the default set against a real runtime, golden cases reported
as not yet recorded until ``--record`` keeps their outputs in the stack's history beside the
release, then reproduced; the stack's threshold as the exit code, and every bad file refused with
its file, line and field before anything is sent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import boto3
import pytest
from fab_program import fab

from frontier import project
from tests.verify.harness import MODEL, connected, url_of

BUCKET = "frontier-local-history"

RELEASE = "r-0123456789ab"
ONE_PASS_ONE_FAIL = """
cases:
  - {name: answered, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 1}, expect: {status: 200}}
  - {name: refused, kind: bad_input, raw: "[", expect: {status: 413}}
"""
GOLDEN_ONLY = """
cases:
  - name: greedy
    kind: golden
    route: completions
    request: {prompt: once upon a time, max_tokens: 12}
"""
ONE_NORMAL_ONE_GOLDEN = """
cases:
  - {name: answered, kind: normal, request: {messages: [{role: user, content: hi}], max_tokens: 1}, expect: {status: 200}}
  - name: greedy
    kind: golden
    route: completions
    request: {prompt: once upon a time, max_tokens: 12}
"""


def s3(endpoint: str):
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def recording_key(release: str, set_name: str = "set") -> str:
    return f"history/local/releases/{release}/verify/{set_name}.golden.json"


def read_recording(endpoint: str, release: str = RELEASE) -> dict:
    return json.loads(s3(endpoint).get_object(Bucket=BUCKET, Key=recording_key(release))["Body"].read())


def put_recording(endpoint: str, golden: dict, release: str = RELEASE) -> None:
    """A recording as ``--record`` leaves it: the outputs beside the release, and the pointer."""
    client = s3(endpoint)
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key=recording_key(release), Body=json.dumps(golden, indent=2))
    pointer = {"release": release, "key": recording_key(release).removeprefix("history/local/")}
    client.put_object(Bucket=BUCKET, Key="history/local/verify/set.json", Body=json.dumps(pointer))


@pytest.fixture
def default_set(tmp_path: Path) -> Path:
    """A copy of the shipped default set, so recording writes its golden file beside the copy."""
    target = tmp_path / "default.yaml"
    shutil.copy(project.root() / "stacks/verify/default.yaml", target)
    return target


def test_the_default_set_passes_against_the_runtime_once_its_golden_outputs_are_recorded(
    capsys, runtime, default_set, local_stack
):
    local_stack(default_set)
    code, out, err = fab(
        capsys, "verify", "-s", "local", "--url", runtime.url, "--record", "--release", RELEASE
    )
    assert code == 0, out + err
    assert f"recorded 2 golden output(s) of release {RELEASE}" in out
    for kind in ("normal", "overlong", "bad_input", "structured", "multi_turn", "golden"):
        assert f"{kind}: " in out
    assert "verify: cases=16 passed=16 failed=0 not_recorded=0 pass_rate=1.000 min_pass_rate=1.000 ok" in out


def test_on_a_fresh_stack_golden_cases_are_reported_as_not_yet_recorded_and_the_rest_run(
    capsys, runtime, write_set, local_stack
):
    local_stack(write_set(ONE_NORMAL_ONE_GOLDEN))
    code, out, err = fab(capsys, "verify", "-s", "local", "--url", runtime.url)
    assert code == 0, out + err
    assert "not yet recorded — run `fab verify --record`" in out
    assert "verify: cases=2 passed=1 failed=0 not_recorded=1 pass_rate=1.000 min_pass_rate=1.000 ok" in out
    assert "1 golden case(s) not yet recorded (greedy) — run `fab verify -s local --record`" in out


def test_the_default_set_on_a_fresh_stack_runs_every_case_but_the_golden_ones_and_exits_0(
    capsys, runtime, default_set, local_stack
):
    local_stack(default_set)
    code, out, err = fab(capsys, "verify", "-s", "local", "--url", runtime.url)
    assert code == 0, out + err
    assert "verify: cases=16 passed=14 failed=0 not_recorded=2 pass_rate=1.000" in out


def test_a_set_whose_every_case_is_unrecorded_exits_1_as_nothing_was_verified(
    capsys, runtime, write_set, local_stack
):
    local_stack(write_set(GOLDEN_ONLY))
    code, out, _ = fab(capsys, "verify", "-s", "local", "--url", runtime.url)
    assert code == 1
    assert "not_recorded=1 pass_rate=0.000 min_pass_rate=1.000 NOTHING RAN" in out


def test_golden_outputs_are_kept_in_the_stacks_history_beside_the_release_they_came_from(
    capsys, runtime, write_set, local_stack, history
):
    set_path = write_set(GOLDEN_ONLY)
    local_stack(set_path)
    code, out, err = fab(
        capsys, "verify", "-s", "local", "--url", runtime.url, "--record", "--release", RELEASE
    )
    assert code == 0, out + err
    assert f"to s3://{BUCKET}/{recording_key(RELEASE)}" in out
    golden = read_recording(history)
    assert (golden["model"], golden["release"]) == (MODEL, RELEASE)
    assert len(golden["outputs"]["greedy"]["tokens"]) == 12
    assert not set_path.with_name("set.golden.json").exists(), "nothing is written beside the set"


def test_a_later_run_reproduces_the_recorded_golden_outputs(capsys, runtime, write_set, local_stack):
    local_stack(write_set(GOLDEN_ONLY))
    fab(capsys, "verify", "-s", "local", "--url", runtime.url, "--record", "--release", RELEASE)
    code, out, err = fab(capsys, "verify", "-s", "local", "--url", runtime.url)
    assert code == 0, out + err
    assert f"equal to release {RELEASE} (12 tokens)" in out


def test_a_changed_output_fails_its_golden_case_naming_the_first_token_that_differs(
    capsys, runtime, write_set, local_stack, history
):
    local_stack(write_set(GOLDEN_ONLY))
    fab(capsys, "verify", "-s", "local", "--url", runtime.url, "--record", "--release", RELEASE)
    golden = read_recording(history)
    tokens = golden["outputs"]["greedy"]["tokens"]
    said = tokens[4]
    tokens[4] = said + "x"  # the reference release said something else from token 4 on
    golden["outputs"]["greedy"]["text"] = "".join(tokens)
    put_recording(history, golden)
    code, out, _ = fab(capsys, "verify", "-s", "local", "--url", runtime.url)
    assert code == 1
    assert f"token 4: {said!r}" in out
    assert f"where release {RELEASE} gave" in out
    assert "verify: cases=1 passed=0 failed=1 not_recorded=0 pass_rate=0.000" in out


@pytest.mark.parametrize(("min_pass_rate", "exit_code"), [(0.5, 0), (0.75, 1)])
def test_the_exit_code_says_whether_the_pass_rate_reaches_the_stacks_threshold(
    capsys, runtime, write_set, local_stack, min_pass_rate, exit_code
):
    local_stack(write_set(ONE_PASS_ONE_FAIL), min_pass_rate=min_pass_rate)
    code, out, _ = fab(capsys, "verify", "-s", "local", "--url", runtime.url)
    assert code == exit_code
    assert f"pass_rate=0.500 min_pass_rate={min_pass_rate:.3f}" in out
    assert "│ refused" in out and "status 400, expected 413" in out


# -- bad files: refused before any request, naming the file, the line and the field ----------------


def _refused(capsys, listener, set_path: Path) -> str:
    code, out, err = fab(capsys, "verify", "-s", "local", "--url", url_of(listener))
    assert code == 2, out + err
    assert not connected(listener), "a request was sent although the set is not valid"
    return out + err


def test_an_unknown_case_kind_is_refused_with_its_line(capsys, listener, write_set, local_stack):
    set_path = write_set(
        """cases:
  - {name: ok, kind: bad_input, raw: "[", expect: {status: 400}}
  - name: odd
    kind: vibes
    expect: {status: 200}
"""
    )
    local_stack(set_path)
    message = _refused(capsys, listener, set_path)
    assert (
        f"{set_path}:4: cases[1].kind = 'vibes': unknown case kind; the kinds are normal, overlong, "
        "bad_input, structured, multi_turn, golden" in message
    )


def test_a_case_with_no_expectation_is_refused_with_its_line(capsys, listener, write_set, local_stack):
    set_path = write_set(
        """cases:
  - name: hopes
    kind: normal
    request: {messages: [{role: user, content: hi}]}
"""
    )
    local_stack(set_path)
    message = _refused(capsys, listener, set_path)
    assert f"{set_path}:2: cases[0].expect: missing: a case with no expectation checks nothing" in message


def test_an_expectation_that_names_no_check_is_refused_with_its_line(
    capsys, listener, write_set, local_stack
):
    set_path = write_set(
        """cases:
  - name: hopes
    kind: normal
    request: {messages: [{role: user, content: hi}]}
    expect: {}
"""
    )
    local_stack(set_path)
    message = _refused(capsys, listener, set_path)
    assert f"{set_path}:5: cases[0].expect: names no check: give at least one of status" in message


def test_a_refusal_expected_with_a_success_status_is_refused_with_its_range(
    capsys, listener, write_set, local_stack
):
    set_path = write_set(
        """cases:
  - name: backwards
    kind: bad_input
    raw: "["
    expect:
      status: 200
"""
    )
    local_stack(set_path)
    message = _refused(capsys, listener, set_path)
    assert (
        f"{set_path}:6: cases[0].expect.status[0] = 200: Input should be greater than or equal to 400"
        in message
    )


def test_golden_outputs_recorded_for_another_model_are_refused(
    capsys, listener, write_set, local_stack, history
):
    set_path = write_set(GOLDEN_ONLY)
    golden = {
        "model": "another-model",
        "release": RELEASE,
        "recorded_at": "2026-01-01T00:00:00Z",
        "outputs": {"greedy": {"text": "x", "tokens": ["x"], "finish_reason": "length"}},
    }
    local_stack(set_path)
    put_recording(history, golden)
    message = _refused(capsys, listener, set_path)
    assert (
        f"s3://{BUCKET}/{recording_key(RELEASE)}:2: model = 'another-model': recorded for another model "
        f"(release {RELEASE}); this run verifies '{MODEL}'" in message
    )


def test_a_broken_recording_is_refused_naming_its_place_line_and_field(
    capsys, listener, write_set, local_stack, history
):
    set_path = write_set(GOLDEN_ONLY)
    local_stack(set_path)
    put_recording(
        history, {"model": MODEL, "release": RELEASE, "recorded_at": "x", "outputs": {"greedy": {}}}
    )
    message = _refused(capsys, listener, set_path)
    assert f"s3://{BUCKET}/{recording_key(RELEASE)}:" in message
    assert "outputs.greedy.text: Field required" in message


def test_a_pass_rate_threshold_out_of_range_is_refused_by_the_stack(capsys, listener, write_set, local_stack):
    stack_file = local_stack(write_set(ONE_PASS_ONE_FAIL), min_pass_rate=1.5)
    message = _refused(capsys, listener, stack_file)
    assert "verify.min_pass_rate = 1.5: Input should be less than or equal to 1" in message


def test_recording_from_an_endpoint_that_does_not_answer_writes_nothing(
    capsys, listener, write_set, local_stack, history
):
    set_path = write_set(GOLDEN_ONLY)
    local_stack(set_path)
    url = url_of(listener)
    listener.close()  # nothing answers there any more
    code, out, err = fab(capsys, "verify", "-s", "local", "--url", url, "--record", "--release", RELEASE)
    assert code == 2
    assert "golden case 'greedy': status 0, not an answer to record: no response: ConnectError" in out + err
    assert "Contents" not in s3(history).list_objects_v2(Bucket=BUCKET, Prefix="history/local/verify/")
