"""One host's release directory, driven by the real host control script (through a local connection:
the same commands SSH would run, on a scratch root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frontier.artifact import Artifact
from frontier.host import HostError, HostSession
from frontier.inventory import HostSpec, LocalConnection
from frontier.release import Release
from frontier.stack import load_stack


@pytest.fixture
def session(tmp_path: Path) -> HostSession:
    host = HostSpec("host-x", "127.0.1.7", 22, str(tmp_path / "root"), "cpu")
    return HostSession(load_stack("local"), host, LocalConnection(host))


def release(n: int) -> Release:
    # An image release: staging needs no wheel, so these tests stay fast.
    return Release(
        Artifact("sha256:" + f"{n:x}" * 64, "image"),
        {"runtime.yaml": f"n: {n}\n", "unit.service": "[Unit]\n"},
    )


def link(session: HostSession, name: str) -> str:
    return os.path.basename(os.readlink(Path(session.root) / name))


def test_staging_is_verified_and_skipped_when_the_release_is_already_there(session):
    r = release(1)
    assert session.stage(r, None) is True
    staged = Path(session.root) / "releases" / r.id
    assert (staged / "runtime.yaml").read_text() == "n: 1\n"
    assert (staged / "release.json").read_text() == r.manifest()
    assert session.stage(r, None) is False
    assert not list((Path(session.root) / "releases").glob(".incoming-*"))


def test_activation_swaps_current_and_remembers_previous(session):
    one, two = release(1), release(2)
    session.stage(one, None)
    session.stage(two, None)
    session.ctl("activate", "activate", one.id)
    session.ctl("activate", "activate", two.id)

    assert link(session, "current") == two.id and link(session, "previous") == one.id
    facts = session.facts()
    assert (facts.current, facts.previous) == (two.id, one.id)
    assert not (Path(session.root) / ".current.tmp").exists()


def test_prune_keeps_the_newest_releases_and_never_current_or_previous(session):
    releases = [release(n) for n in range(1, 7)]
    for r in releases:
        session.stage(r, None)
    session.ctl("activate", "activate", releases[0].id)
    session.ctl("activate", "activate", releases[1].id)  # current = 2, previous = 1 (the oldest)

    removed = session.prune(3)

    left = sorted(p.name for p in (Path(session.root) / "releases").iterdir())
    assert releases[0].id in left and releases[1].id in left
    assert len(left) == 3 and set(removed) == {r.id for r in releases} - set(left)


def test_a_tampered_upload_is_never_staged(session):
    r = release(3)
    incoming = Path(session.root) / "releases" / ".incoming-bad"
    incoming.mkdir(parents=True)
    (incoming / "runtime.yaml").write_text("n: 999\n")
    (incoming / "unit.service").write_text("[Unit]\n")
    (incoming / "release.json").write_text(r.manifest())
    session.ensure_ctl()

    with pytest.raises(HostError, match="runtime.yaml has sha256"):
        session.ctl("stage", "stage", r.id, str(incoming))
    assert not (Path(session.root) / "releases" / r.id).exists()


def test_starting_without_a_release_fails_with_the_reason(session):
    with pytest.raises(HostError, match="no current release"):
        session.ctl("start", "start")
