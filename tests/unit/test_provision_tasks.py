"""`fab up` and `fab preview`: the stack's checks first, then Pulumi with the policy pack, always.

No Pulumi CLI can run here: a stand-in `pulumi` on PATH records the command line it was given.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from fab_program import fab

from frontier import project


@pytest.fixture
def pulumi_calls(tmp_path: Path, monkeypatch) -> Path:
    """A `pulumi` on PATH that writes its arguments, one per line, and succeeds."""
    calls = tmp_path / "pulumi-calls"
    shim = tmp_path / "bin" / "pulumi"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {calls}\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{shim.parent}:/usr/bin:/bin")
    return calls


@pytest.fixture(autouse=True)
def _stacks(monkeypatch, stacks_copy):
    monkeypatch.chdir(project.root())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))
    monkeypatch.delenv("FRONTIER_STACK", raising=False)


def test_up_runs_pulumi_with_the_policy_pack_on_the_checked_stack_file(capsys, pulumi_calls, stacks_copy):
    code, _, _ = fab(capsys, "up", "-s", "prod", "--yes")
    assert code == 0
    args = pulumi_calls.read_text().splitlines()
    assert args[0] == "up" and args[-1] == "--yes"
    assert args[args.index("--stack") + 1] == "prod"
    assert args[args.index("--policy-pack") + 1] == str(project.root() / "policy")
    assert args[args.index("--config-file") + 1] == str(stacks_copy / "Pulumi.prod.yaml")


def test_preview_runs_pulumi_with_the_policy_pack(capsys, pulumi_calls):
    code, _, _ = fab(capsys, "preview", "-s", "eks-prod")
    assert code == 0
    args = pulumi_calls.read_text().splitlines()
    assert args[0] == "preview" and "--policy-pack" in args and "--yes" not in args


def test_a_bad_stack_is_refused_before_pulumi_starts(capsys, pulumi_calls, changed_stack):
    changed_stack("prod", {"runtime.port": 80})
    code, _, err = fab(capsys, "up", "-s", "prod", "--yes")
    assert code == 2
    assert "runtime.port = 80" in err
    assert not pulumi_calls.exists()


def test_without_a_pulumi_cli_up_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    code, _, err = fab(capsys, "up", "-s", "prod")
    assert code == 2
    assert "pulumi CLI is not on PATH" in err
