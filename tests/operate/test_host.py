"""One host's release directory, driven through HostSession and the real host agent (over a local
connection: the same commands SSH would run, on a scratch root)."""

from __future__ import annotations

import os
from pathlib import Path

import frontier_hostside
import pytest

from frontier.hosts.inventory import HostSpec
from frontier.hosts.session import HostError, HostSession
from frontier.release.artifact import Artifact
from frontier.release.release import Release
from frontier.targets import load_stack
from frontier.targets.local.connection import LocalConnection


@pytest.fixture
def session(tmp_path: Path) -> HostSession:
    host = HostSpec("host-x", "127.0.1.7", 22, str(tmp_path / "root"), "cpu")
    return HostSession(local := load_stack("local"), local.only_pool, host, LocalConnection(host))


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
    session.activate(one.id)
    session.activate(two.id)

    assert link(session, "current") == two.id and link(session, "previous") == one.id
    facts = session.facts()
    assert (facts.current, facts.previous) == (two.id, one.id)
    assert not (Path(session.root) / ".current.tmp").exists()


def test_prune_keeps_the_newest_releases_and_never_current_or_previous(session):
    releases = [release(n) for n in range(1, 7)]
    for r in releases:
        session.stage(r, None)
    session.activate(releases[0].id)
    session.activate(releases[1].id)  # current = 2, previous = 1 (the oldest)

    removed = session.prune(3)

    left = sorted(p.name for p in (Path(session.root) / "releases").iterdir())
    assert releases[0].id in left and releases[1].id in left
    assert len(left) == 3 and set(removed.releases) == {r.id for r in releases} - set(left)


def test_a_tampered_upload_is_never_staged(session):
    r = release(3)
    incoming = Path(session.root) / "releases" / ".incoming-bad"
    incoming.mkdir(parents=True)
    (incoming / "runtime.yaml").write_text("n: 999\n")
    (incoming / "unit.service").write_text("[Unit]\n")
    (incoming / "release.json").write_text(r.manifest())
    with pytest.raises(HostError, match="stage failed: stage: runtime.yaml has sha256"):
        session.agent("stage", "stage", r.id, str(incoming))
    assert not (Path(session.root) / "releases" / r.id).exists()


def test_starting_without_a_release_fails_with_the_reason(session):
    with pytest.raises(HostError, match="start failed: start: no current release"):
        session.start()


def test_on_a_systemd_host_the_release_unit_is_installed_and_restarted(session, tmp_path, monkeypatch):
    """systemd cannot run here: its presence directory, unit directory and systemctl are stand-ins,
    and systemctl records what it was asked to do."""
    calls = tmp_path / "systemctl.calls"
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (shims / "systemctl").chmod(0o755)
    (tmp_path / "run-systemd").mkdir()
    (tmp_path / "units").mkdir()
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    monkeypatch.setenv("FRONTIER_SYSTEMD_RUN_DIR", str(tmp_path / "run-systemd"))
    monkeypatch.setenv("FRONTIER_UNIT_DIR", str(tmp_path / "units"))
    r = Release(
        Artifact("sha256:" + "e" * 64, "image"),
        {"runtime.yaml": "n: 1\n", "frontier-runtime.service": "[Unit]\n"},
    )
    session.stage(r, None)

    session.activate_and_start(r.id)
    session.activate_and_start(r.id)  # again: the watchdog, unchanged, is only asked to run
    session.stop()

    assert (tmp_path / "units" / "frontier-runtime.service").read_text() == "[Unit]\n"
    # The liveness watchdog runs from a copy of the agent and its names under the root, whatever the
    # upload folder.
    watchdog = (tmp_path / "units" / "frontier-agent.service").read_text()
    root = Path(session.root)
    assert (
        f"ExecStart={session.host.python} {root}/bin/frontier-agent.py --config {root}/bin/frontier-agent.json supervise"
        in watchdog
    )
    for name, data in frontier_hostside.agent_files().items():
        assert (root / "bin" / name).read_bytes() == data, name
    changes = [c for c in calls.read_text().splitlines() if not c.startswith(("is-active", "show"))]
    assert changes == [
        "daemon-reload",
        "restart frontier-runtime",
        "enable frontier-agent.service",
        "restart frontier-agent.service",
        "daemon-reload",
        "restart frontier-runtime",
        "enable frontier-agent.service",
        "start frontier-agent.service",
        "stop frontier-runtime",
    ]
    assert session.facts().systemd is True
    assert "show -p NRestarts --value frontier-runtime" in calls.read_text().splitlines()
