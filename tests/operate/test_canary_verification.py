"""How a canary's verification and its latency are judged against the release it replaces."""

from __future__ import annotations

import pytest

from frontier.config.schema import Gate
from frontier.rollout.canary import CanaryVerification, judge_verification
from frontier.rollout.gate import GateReading, judge_relative
from frontier.verify import CaseResult, VerifyReport, VerifySet


def report(*passed: bool) -> VerifyReport:
    results = tuple(
        CaseResult(
            name=f"case-{i}", kind="golden", passed=ok, why="" if ok else "token 3 differs", seconds=0.1
        )
        for i, ok in enumerate(passed)
    )
    return VerifyReport(endpoint="http://canary", model="m", source="set.yaml", results=results)


def check(min_pass_rate: float = 1.0, max_drop: float = 0.0) -> CanaryVerification:
    return CanaryVerification(
        verify_set=VerifySet(source="set.yaml", cases=[], golden=None),
        model="m",
        context_tokens=1024,
        api_key=None,
        runtime_port=8000,
        min_pass_rate=min_pass_rate,
        max_drop=max_drop,
    )


def test_a_canary_that_passes_every_case_passes() -> None:
    assert judge_verification(report(True, True), report(True, True), check()) is None


def test_a_canary_under_the_stacks_pass_rate_fails_naming_the_failed_cases() -> None:
    verdict = judge_verification(report(True, False), None, check(min_pass_rate=0.9))
    assert verdict is not None
    assert "pass rate 50.0% < verify.min_pass_rate 90.0%" in verdict
    assert "case-1 (golden: token 3 differs)" in verdict


def test_a_canary_worse_than_the_old_release_by_more_than_the_allowed_drop_fails() -> None:
    verdict = judge_verification(
        report(True, True, False, False), report(True, True, True, False), check(0.0, 0.1)
    )
    assert verdict is not None and "< the old release's 75.0% - verify.max_pass_rate_drop 10.0%" in verdict


def test_a_canary_as_good_as_an_imperfect_old_release_passes_when_the_floor_allows() -> None:
    assert judge_verification(report(True, False), report(True, False), check(min_pass_rate=0.5)) is None


def gate(ratio: float | None) -> Gate:
    return Gate(
        window_s=10, max_error_rate=0.01, max_p99_latency_ms=60_000, min_requests=5, max_p99_ratio=ratio
    )


@pytest.mark.parametrize(("canary_p99", "old_p99", "passes"), [(0.11, 0.1, True), (0.13, 0.1, False)])
def test_the_canarys_p99_is_held_to_a_ratio_of_the_old_releases_over_the_same_window(
    canary_p99: float, old_p99: float, passes: bool
) -> None:
    verdict = judge_relative(GateReading(20, 0, canary_p99), GateReading(20, 0, old_p99), gate(1.2))
    assert (verdict is None) is passes
    if not passes:
        assert "130 ms > rollout.gate.max_p99_ratio 1.2 x the old release's 100 ms" in verdict


def test_an_old_host_with_too_few_requests_is_no_yardstick() -> None:
    assert judge_relative(GateReading(20, 0, 1.0), GateReading(2, 0, 0.1), gate(1.2)) is None
