"""The canary's verification: the stack's verification set on each canary host, judged against the
release it replaces.

A canary that serves without errors can still answer wrongly (other weights, a changed KV-cache
dtype, a tokenizer mismatch). Before the rollout goes past the canary, the stack's verification set
(``verify.file``, the cases ``fab verify`` runs) is sent to each canary host's runtime and to one
host still on the old release, each reached through an SSH tunnel to its runtime port (the hosts'
runtime ports are never open to the operator). The canary passes when its pass rate is at least
``verify.min_pass_rate`` and at most ``verify.max_pass_rate_drop`` below the old release's; a
failure names the cases that failed, and the rollout rolls back with that reason in its history.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from frontier.config.schema import Settings
from frontier.verify import VerifyReport, VerifySet, load_set, run_set, set_file


@dataclass(frozen=True)
class CanaryVerification:
    """What a canary is verified with: the set, the model's name and context, the runtime's key."""

    verify_set: VerifySet
    model: str
    context_tokens: int
    api_key: str | None
    runtime_port: int
    min_pass_rate: float
    max_drop: float


def canary_verification(settings: Settings, api_key: str | None) -> CanaryVerification | None:
    """The stack's canary verification, or None where ``rollout.verify_canary`` is off. The set is
    read (and refused, naming file, line and field) before any host is touched."""
    if not settings.rollout.verify_canary:
        return None
    model = settings.model
    return CanaryVerification(
        verify_set=load_set(set_file(settings.verify.file), model=model.name),
        model=model.name,
        context_tokens=model.max_seq_len,
        api_key=api_key,
        runtime_port=settings.runtime.port,
        min_pass_rate=settings.verify.min_pass_rate,
        max_drop=settings.verify.max_pass_rate_drop,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def tunnel(conn: Any, remote_host: str, remote_port: int) -> Iterator[str]:
    """A local URL that reaches ``remote_host:remote_port`` as the host sees it, over ``conn`` (SSH)."""
    port = _free_port()
    with conn.forward_local(local_port=port, remote_port=remote_port, remote_host=remote_host):
        yield f"http://127.0.0.1:{port}"


def verify_through(conn: Any, address: str, check: CanaryVerification) -> VerifyReport:
    """The verification set against the runtime at ``address`` (its port from the stack), via ``conn``."""
    with tunnel(conn, address, check.runtime_port) as url:
        return run_set(
            url, check.api_key, check.verify_set, model=check.model, context_tokens=check.context_tokens
        )


def judge_verification(
    canary: VerifyReport, old: VerifyReport | None, check: CanaryVerification
) -> str | None:
    """None when the canary's report passes, else why not, naming the cases it failed."""
    problems = []
    if canary.pass_rate < check.min_pass_rate:
        problems.append(f"pass rate {canary.pass_rate:.1%} < verify.min_pass_rate {check.min_pass_rate:.1%}")
    if old is not None and canary.pass_rate < old.pass_rate - check.max_drop:
        problems.append(
            f"pass rate {canary.pass_rate:.1%} < the old release's {old.pass_rate:.1%} "
            f"- verify.max_pass_rate_drop {check.max_drop:.1%}"
        )
    if not problems:
        return None
    failed = "; ".join(f"{r.name} ({r.kind}: {r.why})" for r in canary.failures)
    return f"verification: {', '.join(problems)}; failed cases: {failed or 'none'}"
