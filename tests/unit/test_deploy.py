"""``deploy`` and ``rollback`` hand a release to the stack's target, under its lock, and record it.

The target is a fake Backend (:class:`FakeBackend`) that rolls by writing down what it was handed;
the history is a real history store on moto's S3, in process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import boto3
import pytest
from frontier_hostside.agent import Facts
from moto import mock_aws

from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, LockInfo
from frontier.release.release import Release
from frontier.rollout.deploy import deploy, deploy_plan, rollback
from frontier.rollout.rolling import Reporter, RolloutFailed, RolloutResult
from frontier.targets import load_stack

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


@dataclass
class FakeBackend:
    """A target of three hosts that says every host runs ``running`` and rolls by taking notes."""

    settings: Settings
    store: HistoryStore
    outcome: str = "succeeded"
    running: str = ""
    #: (kind, release id, the deploy lock as it stood while rolling), one per roll.
    rolled: list[tuple[str, str, LockInfo | None]] = field(default_factory=list)

    @property
    def pool(self) -> PoolSettings:
        return self.settings.only_pool

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        return [HostSpec(f"host-{i}", f"10.0.0.{i}", 22, "/srv/frontier", "h100") for i in (1, 2, 3)]

    def session(self, host: HostSpec) -> FakeSession:
        return FakeSession(Facts(current=self.running, running=True, running_release=self.running))

    def history_store(self) -> HistoryStore:
        return self.store

    def rollout_size(self) -> int:
        return len(self.hosts())

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        self.rolled.append((kind, release.id, self.store.read_lock()))
        reason = "" if self.outcome == "succeeded" else "the canary failed its gate"
        return RolloutResult(kind, release.id, outcome=self.outcome, reason=reason)


@dataclass
class FakeSession:
    facts_now: Facts

    def facts(self, release_id: str = "") -> Facts:
        return self.facts_now

    def close(self) -> None:
        pass


@pytest.fixture
def backend() -> Iterator[FakeBackend]:
    settings = load_stack("prod")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="history")
        store = HistoryStore(s3, "history", settings.stack, "history/prod/")
        for digest in (DIGEST_A, DIGEST_B):
            store.put_artifact(Artifact(digest=digest, kind="image", image=f"repo@{digest}"), None)
        yield FakeBackend(settings, store)


def test_deploy_hands_the_release_to_the_target_under_the_stacks_lock(backend):
    result = deploy(backend, DIGEST_A)
    ((kind, release, lock),) = backend.rolled
    assert (kind, release) == ("deploy", result.release)
    assert lock is not None and lock.purpose == f"deploy {result.release}"
    assert backend.store.read_lock() is None  # released once the roll returned


def test_a_deploy_is_recorded_in_the_history(backend):
    result = deploy(backend, DIGEST_A)
    (record,) = backend.store.records()
    assert (record["kind"], record["release"], record["digest"], record["outcome"]) == (
        "deploy",
        result.release,
        DIGEST_A,
        "succeeded",
    )


def test_a_failed_roll_is_recorded_then_raised(backend):
    backend.outcome = "rolled_back"
    with pytest.raises(RolloutFailed, match="the canary failed its gate"):
        deploy(backend, DIGEST_A)
    (record,) = backend.store.records()
    assert record["outcome"] == "rolled_back"


def test_a_mutable_tag_is_refused_before_the_target_is_asked(backend):
    with pytest.raises(FrontierError, match="mutable tags such as ':latest' are refused"):
        deploy(backend, "frontier-runtime:latest")
    assert backend.rolled == []


def test_rollback_rolls_the_previous_good_release_as_it_was_stored(backend):
    first = deploy(backend, DIGEST_A)
    deploy(backend, DIGEST_B)
    back = rollback(backend)
    assert back.release == first.release
    assert [(kind, release) for kind, release, _ in backend.rolled][-1] == ("rollback", first.release)


def test_the_plan_asks_each_host_what_it_runs_and_rolls_nothing(backend):
    release, _ = deploy_plan(backend, DIGEST_A)
    backend.running = release.id
    _, planned = deploy_plan(backend, DIGEST_A)
    assert [(p.host, p.action) for p in planned] == [
        ("host-1", "skip (already runs it)"),
        ("host-2", "skip (already runs it)"),
        ("host-3", "skip (already runs it)"),
    ]
    assert backend.rolled == []
