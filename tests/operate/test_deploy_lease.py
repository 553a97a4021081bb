"""The deploy lock is a lease: the running deploy renews it, a dead holder's lapses within the lease.

Everything runs against moto's S3 server (a real HTTP endpoint on a free port), so the conditional
writes the lease relies on (If-None-Match: * to take it, If-Match on the ETag to renew and to
release it) go through botocore and moto exactly as they would to S3. Leases here are a second or
two, not a minute, and renewals a fraction of that, so the tests wait real time but little of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError

from frontier import project
from frontier.config.schema import PoolSettings, Settings
from frontier.hosts.inventory import HostSpec
from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore, LockHeld, LockInfo, LockLost
from frontier.release.release import Release
from frontier.rollout.deploy import deploy
from frontier.rollout.rolling import Event, Reporter, RolloutFailed, RolloutResult
from frontier.targets import load_stack
from tests.moto_server import moto_server

DIGEST = "sha256:" + "e" * 64
BUCKET = "frontier-local-history"  # the local stack's, so `fab status -s local` reads this one
PREFIX = "history/local/"
LEASE_S = 1.5
RENEW_EVERY_S = 0.25
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint)
    # A fresh bucket per test: no lock or record left over from another.
    with_objects = client.list_objects_v2(Bucket=BUCKET) if _exists(client) else {}
    for obj in with_objects.get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    if not _exists(client):
        client.create_bucket(Bucket=BUCKET)
    return client


def _exists(client) -> bool:
    try:
        client.head_bucket(Bucket=BUCKET)
        return True
    except ClientError:
        return False


@pytest.fixture
def store(s3) -> HistoryStore:
    store = HistoryStore(s3, BUCKET, "local", PREFIX, lease_s=LEASE_S, renew_every_s=RENEW_EVERY_S)
    store.put_artifact(Artifact(digest=DIGEST, kind="image", image=f"repo@{DIGEST}"), None)
    return store


@dataclass
class SteppingTarget:
    """A target of three hosts that rolls them one step at a time, ``step_s`` each.

    Like every target's rollout, it reports a host step's start before taking it and never raises
    for a failed rollout: whatever stops a step (the reporter included) ends it with that reason.
    ``during`` runs after each step (the test's hand on the lock while the deploy runs).
    """

    settings: Settings
    store: HistoryStore
    step_s: float = 0.6  # over two renewals: each host step sees a newer lease
    during: list = field(default_factory=list)
    taken: list[str] = field(default_factory=list)
    locks: list[LockInfo | None] = field(default_factory=list)

    @property
    def pool(self) -> PoolSettings:
        return self.settings.only_pool

    def hosts(self, group: str | None = None) -> list[HostSpec]:
        return [HostSpec(f"host-{i}", f"10.0.0.{i}", 22, "/srv/frontier", "h100") for i in (1, 2, 3)]

    def session(self, host: HostSpec):
        raise AssertionError("deploy does not plan")

    def history_store(self) -> HistoryStore:
        return self.store

    def rollout_size(self) -> int:
        return 3

    def roll(self, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
        report = reporter or (lambda event: None)
        result = RolloutResult(kind, release.id)
        try:
            for host in self.hosts():
                report(Event(host.name, "switch", "start"))
                time.sleep(self.step_s)
                self.taken.append(host.name)
                self.locks.append(self.store.read_lock())
                for act in self.during:
                    act(host.name)
        except Exception as exc:  # noqa: BLE001 - the rollout's contract: a failure is its result
            result.outcome, result.reason = "failed", str(exc)
        else:
            result.outcome = "succeeded"
        return result


def test_a_running_deploys_lease_is_renewed_so_its_expiry_moves(store):
    target = SteppingTarget(load_stack("prod"), store)
    deploy(target, DIGEST)
    first, second, third = target.locks
    assert first and second and third
    # Same taking (holder, start and token), a later lease each time, written by a new put.
    assert {(lock.holder, lock.since, lock.token) for lock in target.locks} == {
        (first.holder, first.since, first.token)
    }
    assert first.lease_until < second.lease_until < third.lease_until
    assert first.renewed < second.renewed < third.renewed
    assert len({lock.etag for lock in target.locks}) == 3
    assert store.read_lock() is None  # released with the latest renewal's ETag


def test_a_deploy_whose_lock_was_taken_over_stops_before_its_next_host_step_saying_why(store):
    target = SteppingTarget(load_stack("prod"), store)

    def taken_over_after_the_first_host(host: str) -> None:
        if host == "host-1":
            store.break_lock()
            store.acquire("deploy r-0000000000ff", holder="bob@ci")
            time.sleep(3 * RENEW_EVERY_S)  # a renewal meets bob's lock

    target.during.append(taken_over_after_the_first_host)
    with pytest.raises(RolloutFailed, match=r"taken over while deploy r-\w+ ran: now held by bob@ci") as err:
        deploy(target, DIGEST)
    assert target.taken == ["host-1"]  # host-2's step was never taken
    assert err.value.result.outcome == "failed"
    lock = store.read_lock()
    assert lock is not None and lock.holder == "bob@ci"  # our release left bob's lock alone
    (record,) = store.records()
    assert record["outcome"] == "failed" and "now held by bob@ci" in record["reason"]


def test_a_deploy_whose_lock_was_removed_stops_and_says_it_was_removed(store):
    target = SteppingTarget(load_stack("prod"), store)

    def unlocked_after_the_first_host(host: str) -> None:
        if host == "host-1":
            store.break_lock()  # `fab unlock` while it runs
            time.sleep(3 * RENEW_EVERY_S)

    target.during.append(unlocked_after_the_first_host)
    with pytest.raises(RolloutFailed, match="was removed while deploy"):
        deploy(target, DIGEST)
    assert target.taken == ["host-1"]


def test_s3_refuses_a_put_whose_if_match_is_not_the_stored_objects_etag(s3):
    """What a renewal relies on: S3 writes with If-Match only over the very object we last wrote."""
    key = PREFIX + "lock/deploy.json"
    ours = s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"holder": "alice"}')["ETag"]
    theirs = s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"holder": "bob"}')["ETag"]
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"holder": "alice", "renewed": 1}', IfMatch=ours)
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert s3.head_object(Bucket=BUCKET, Key=key)["ETag"] == theirs
    s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"holder": "bob", "renewed": 1}', IfMatch=theirs)


def test_s3_answers_no_such_key_to_a_put_with_if_match_on_a_removed_object(s3):
    """A renewal after `fab unlock` is not a fresh take: S3 refuses it instead of creating the lock."""
    key = PREFIX + "lock/deploy.json"
    etag = s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}")["ETag"]
    s3.delete_object(Bucket=BUCKET, Key=key)
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"{}", IfMatch=etag)
    assert refused.value.response["Error"]["Code"] in ("NoSuchKey", "404")
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=key).get("KeyCount", 0) == 0


def test_a_renewal_never_overwrites_a_lock_another_holder_took(store):
    alice = store.acquire("deploy r-000000000001", holder="alice@laptop")
    time.sleep(LEASE_S + 0.1)  # alice stalled past her lease
    bob = store.acquire("deploy r-000000000002", holder="bob@ci")
    assert bob.replaced.startswith("alice@laptop (deploy r-000000000001)")
    with pytest.raises(LockLost, match="now held by bob@ci"):
        store.renew(alice)
    lock = store.read_lock()
    assert lock is not None and (lock.holder, lock.etag) == ("bob@ci", bob.etag)


def test_a_lock_is_not_taken_while_its_lease_is_renewed_past_its_first_term(store):
    with store.leased("deploy r-000000000001") as lease:
        time.sleep(LEASE_S + 0.5)  # longer than one lease: only the renewals keep it
        with pytest.raises(LockHeld, match="last renewed .* lease expires"):
            store.acquire("deploy r-000000000002", holder="bob@ci")
        lease.check()  # still ours


HOLDER = textwrap.dedent(
    """
    import sys, time, boto3
    from frontier.release.history import HistoryStore
    s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=sys.argv[1])
    store = HistoryStore(s3, sys.argv[2], "local", sys.argv[3], lease_s=float(sys.argv[4]),
                         renew_every_s=float(sys.argv[5]))
    with store.locked("rollback r-0000000000aa"):
        print("held", flush=True)
        time.sleep(3600)
    """
)


def test_a_killed_holders_lock_lapses_within_the_lease_and_the_next_deploy_takes_it_naming_it(
    endpoint, store
):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, endpoint, BUCKET, PREFIX, str(LEASE_S), str(RENEW_EVERY_S)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **CREDENTIALS},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        first = store.read_lock()
        time.sleep(3 * RENEW_EVERY_S)
        renewed = store.read_lock()
        assert first and renewed and renewed.lease_until > first.lease_until  # that process renews it
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    killed_at = time.monotonic()
    with pytest.raises(LockHeld, match=r"\(rollback r-0000000000aa\)"):
        deploy(SteppingTarget(load_stack("prod"), store, step_s=0), DIGEST)

    events: list[Event] = []
    while True:
        try:
            deploy(SteppingTarget(load_stack("prod"), store, step_s=0), DIGEST, reporter=events.append)
            break
        except LockHeld:
            assert time.monotonic() - killed_at < LEASE_S + 1.0, "the dead holder's lock did not lapse"
            time.sleep(0.1)
    assert time.monotonic() - killed_at <= LEASE_S + 1.0
    (took_over,) = [e for e in events if e.phase == "lock"]
    assert took_over.detail.startswith(
        f"took over the lapsed lock of {renewed.holder} (rollback r-0000000000aa)"
    )


# --- `fab status` and `fab unlock`, as an operator types them ----------------------------------------


@pytest.fixture
def local_stack(endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local stack with its state in ``tmp_path`` (no host in service) and AWS at ``endpoint``."""
    document = yaml.safe_load((project.stacks_dir() / "Pulumi.local.yaml").read_text())
    document["config"]["frontier:local"]["state_dir"] = str(tmp_path / "state")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "group.json").write_text(json.dumps({"in_service": []}))
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.local.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks))
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.chdir(project.root())


def _fab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from fabric.main import program

    try:
        program.run(["fab", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())  # the console wraps long lines


def test_fab_status_shows_the_locks_holder_purpose_last_renewal_and_expiry(local_stack, store, capsys):
    with store.leased("deploy r-000000000007") as lease:
        code, out = _fab(capsys, "status", "-s", "local")
        info = lease.info
        assert code == 0, out
        assert f"deploy lock: {info.holder} (deploy r-000000000007) since {info.since}" in out
        assert "last renewed 20" in out and "lease expires 20" in out
    lapsed = store.acquire("rollback r-000000000006", holder="crashed@ci")
    time.sleep(LEASE_S + 0.1)
    code, out = _fab(capsys, "status", "-s", "local")
    assert f"crashed@ci (rollback r-000000000006) since {lapsed.since}" in out
    assert f"lease lapsed {lapsed.lease_until}" in out and "the next deploy takes it over" in out


def test_fab_unlock_of_a_live_lease_says_its_deploy_stops(local_stack, store, capsys):
    with store.leased("deploy r-000000000008") as lease:
        code, out = _fab(capsys, "unlock", "-s", "local")
        assert code == 0 and f"removed the deploy lock held by {lease.info.holder}" in out
        assert "that deploy stops before its next host step" in out
        time.sleep(3 * RENEW_EVERY_S)
        with pytest.raises(LockLost, match="was removed"):
            lease.check()
