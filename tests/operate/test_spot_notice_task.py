"""``fab spot.notice``: bad options are refused, naming the option, its value and what is allowed,
before anything is posted; a slot with no IMDS stand-in says how to start one.

No process runs here: the stack file is a private copy of the local stack that was never brought up.
"""

from __future__ import annotations

import pytest

from tests.e2e.stackcopy import write_local_stack
from tests.fab_program import fab


@pytest.fixture
def stack(tmp_path, monkeypatch):
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(write_local_stack(tmp_path, hosts=2)))
    return tmp_path


def test_an_unknown_host_is_refused_naming_the_slots_of_the_stack(stack, capsys):
    code, out, err = fab(capsys, "spot.notice", "--stack", "local", "--host", "host-9")
    assert code == 2
    assert "--host 'host-9'" in err and "host-1, host-2" in err


def test_a_notice_time_out_of_range_is_refused_with_the_range(stack, capsys):
    code, _, err = fab(capsys, "spot.notice", "--stack", "local", "--host", "host-1", "--in-s", "7200")
    assert code == 2
    assert "--in-s 7200" in err and "between 0 and 3600" in err


def test_an_action_ec2_does_not_give_is_refused_naming_the_actions(stack, capsys):
    code, _, err = fab(capsys, "spot.notice", "--stack", "local", "--host", "host-1", "--action", "reboot")
    assert code == 2
    assert "--action 'reboot'" in err and "terminate, stop, hibernate" in err


def test_a_slot_of_a_stack_not_up_has_no_imds_and_the_error_says_to_bring_it_up(stack, capsys):
    code, _, err = fab(capsys, "spot.notice", "--stack", "local", "--host", "host-2")
    assert code == 2
    assert "host-2: no IMDS stand-in runs for it" in err and "fab local.up --stack local" in err
    assert not (stack / "state" / "hosts" / "host-2" / "run" / "interruption.json").exists()
