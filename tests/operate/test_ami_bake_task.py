"""``fab ami.bake`` refuses what it cannot bake from, naming the option, before it starts anything."""

from __future__ import annotations

import pytest
from invoke import Context
from invoke.exceptions import Exit

from frontier.cli import ami


def test_without_a_subnet_the_bake_says_what_kind_of_subnet_it_needs() -> None:
    with pytest.raises(Exit) as refused:
        ami.ami_bake(Context(), stack="prod")
    assert refused.value.code == 2
    assert "--subnet: a subnet whose instances reach the internet" in str(refused.value.message)


def test_an_unknown_group_is_refused_naming_the_stacks_groups() -> None:
    with pytest.raises(Exit) as refused:
        ami.ami_bake(Context(), stack="prod", group="a100", subnet="subnet-0a1b2c3d")
    assert str(refused.value.message) == "error: --group 'a100': stack 'prod' has node groups h100"


def test_a_timeout_that_is_not_a_positive_number_is_refused() -> None:
    with pytest.raises(Exit, match=r"--timeout-s '-5': must be a positive number of seconds"):
        ami.ami_bake(Context(), stack="prod", subnet="subnet-0a1b2c3d", timeout_s="-5")
