"""The canary's verification: the stack's verification set on each canary host, judged against the
release it replaces.

A canary that serves without errors can still answer wrongly (other weights, a changed KV-cache
dtype, a tokenizer mismatch). Before the rollout goes past the canary, the stack's verification set
(``verify.file``, the cases ``fab verify`` runs) is sent to each canary host's runtime and to one
host still on the old release, each reached through an SSH tunnel to its runtime port (the hosts'
runtime ports are never open to the operator). The canary passes when its pass rate is at least
``verify.min_pass_rate`` and at most ``verify.max_pass_rate_drop`` below the old release's; a
failure names the cases that failed, and the rollout rolls back with that reason in its history.

Golden cases are held to the stack's recording (``fab verify --record``). Where none was made yet,
the old host's greedy outputs are recorded first, kept in the history beside the old release (the
reference a canary is judged against is the release it replaces), and the canary held to them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frontier.config.schema import PoolSettings, Settings
from frontier.release.history import HistoryStore
from frontier.rollout.recordings import load_for_stack, store_recording
from frontier.verify import VerifyReport, VerifySet, record_golden, run_set, set_file
from frontier.verify.cases import GoldenCase


@dataclass(frozen=True)
class CanaryVerification:
    """What a canary is verified with: the set, the model's name and context, the runtime's key,
    and the history its golden outputs are kept in (``set_path`` names them there)."""

    verify_set: VerifySet
    model: str
    context_tokens: int
    api_key: str | None
    runtime_port: int
    min_pass_rate: float
    max_drop: float
    store: HistoryStore | None = None
    set_path: Path | None = None

    @property
    def unrecorded(self) -> bool:
        """Whether some golden case has no recorded output to be held to."""
        golden = self.verify_set.golden
        return any(
            isinstance(case, GoldenCase) and (golden is None or case.name not in golden.outputs)
            for case in self.verify_set.cases
        )

    def recorded_from(self, release: str, conn: Any, address: str) -> CanaryVerification:
        """:meth:`recorded_at` the runtime at ``address``, reached over ``conn`` (SSH)."""
        with tunnel(conn, address, self.runtime_port) as url:
            return self.recorded_at(release, url)

    def recorded_at(self, release: str, url: str) -> CanaryVerification:
        """This verification with the golden outputs of the runtime at ``url`` (on ``release``, the
        one the canary replaces) recorded, kept in the history beside that release, and held."""
        assert self.store is not None and self.set_path is not None
        outputs = record_golden(url, self.api_key, self.verify_set, model=self.model)
        store_recording(self.store, self.set_path, model=self.model, release=release, outputs=outputs)
        held = load_for_stack(self.store, self.set_path, model=self.model)
        return dataclasses.replace(self, verify_set=held)

    def run_at(self, url: str) -> VerifyReport:
        """The verification set against the runtime at ``url``."""
        return run_set(
            url, self.api_key, self.verify_set, model=self.model, context_tokens=self.context_tokens
        )


def canary_verification(
    settings: Settings, pool: PoolSettings, api_key: str | None, store: HistoryStore
) -> CanaryVerification | None:
    """The canary verification of ``pool``'s rollouts, or None where ``rollout.verify_canary`` is
    off. The set is read (and refused, naming file, line and field), with the golden outputs
    ``store`` holds for it, before any host is touched."""
    if not settings.rollout.verify_canary:
        return None
    model = pool.model
    set_path = set_file(settings.verify.file)
    return CanaryVerification(
        verify_set=load_for_stack(store, set_path, model=model.name),
        model=model.name,
        context_tokens=model.max_seq_len,
        api_key=api_key,
        runtime_port=pool.runtime.port,
        min_pass_rate=settings.verify.min_pass_rate,
        max_drop=settings.verify.max_pass_rate_drop,
        store=store,
        set_path=set_path,
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
        return check.run_at(url)


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
