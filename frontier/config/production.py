"""What a production stack (``frontier:production: true``) may not leave out or turn on.

A production rollout proves the new release on its canary against the release it replaces: its
answers (``rollout.verify_canary``, the stack's verification set) as well as its errors and latency.
Debug logging writes every request's text to the logs and slows the engine: it is for a stack
someone is watching, never one that serves users.
"""

from __future__ import annotations

from collections.abc import Iterator

from frontier_settings import FieldProblem

from frontier.config.schema import Settings


def production_problems(s: Settings) -> Iterator[FieldProblem]:
    if not s.production:
        return
    if not s.rollout.verify_canary:
        yield FieldProblem(
            "rollout.verify_canary",
            s.rollout.verify_canary,
            "must be true on a production stack (production: true): a canary's answers are checked "
            "against the release it replaces before the rollout goes on",
        )
    for i, pool in enumerate(s.pools):
        if pool.runtime.log_level == "debug":
            yield FieldProblem(
                "runtime.log_level",
                pool.runtime.log_level,
                "must be info, warning or error on a production stack (production: true): debug logs "
                "every request's text and slows the engine",
            ).under(f"pools[{i}]")
