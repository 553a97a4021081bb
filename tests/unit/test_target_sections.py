"""A stack's target and its section are one typed value (``Settings.platform``): the local stack's
``frontier:local``, the Kubernetes ``frontier:kubernetes``, or EC2's, which needs no section. Code of
a target reads its section through ``Settings.section(Kind)``, never an optional it must check."""

from __future__ import annotations

import ast

import pytest

from frontier import project
from frontier.config.load import available_stacks
from frontier.config.schema import Ec2, Kubernetes, Local
from frontier.errors import StackError
from frontier.targets import load_stack

SECTIONS = {"local": Local, "ec2": Ec2, "kubernetes": Kubernetes}
ROOTS = ("frontier", "infra", "policy")


@pytest.mark.parametrize("stack", available_stacks())
def test_every_stack_file_loads_with_its_targets_own_section(stack):
    settings = load_stack(stack)
    assert isinstance(settings.platform, SECTIONS[settings.target])
    assert settings.section(SECTIONS[settings.target]) is settings.platform


def test_the_local_stack_is_known_by_its_section_alone():
    assert load_stack("local").target == "local"


def test_another_targets_section_is_refused_naming_the_stack_and_its_target():
    with pytest.raises(StackError, match=r"stack 'prod' runs on target 'ec2', not 'kubernetes'"):
        load_stack("prod").section(Kubernetes)


def test_a_section_of_another_target_is_refused_as_the_file_is_read(changed_stack):
    with pytest.raises(StackError, match=r"target = 'ec2': must be 'local' \(or absent\)"):
        load_stack("local", path=changed_stack("local", {"target": "ec2"}))


def test_a_target_without_its_section_is_refused_naming_the_section(changed_stack):
    with pytest.raises(
        StackError, match=r"kubernetes: target 'kubernetes' needs its 'frontier:kubernetes' section"
    ):
        load_stack("prod", path=changed_stack("prod", {"target": "kubernetes"}))


def test_a_problem_inside_a_section_is_named_where_the_file_writes_it(changed_stack):
    with pytest.raises(StackError, match=r"\n  local\.moto_port = 5: "):
        load_stack("local", path=changed_stack("local", {"local.moto_port": 5}))


def test_no_code_asserts_that_a_target_section_is_there():
    """``assert settings.local is not None`` is what ``section(Local)`` replaces: typed, and a clear
    error where ``python -O`` would strip the assert and fail later on None."""
    root = project.root()
    found = [
        f"{path.relative_to(root)}:{line}"
        for top in ROOTS
        for path in sorted((root / top).rglob("*.py"))
        for line in asserted_sections(ast.parse(path.read_text()))
    ]
    assert not found, f"read the section with settings.section(Local | Kubernetes): {found}"


def asserted_sections(tree: ast.AST) -> list[int]:
    """Lines that assert a target section is not None: the attribute itself, or a name bound to it."""
    bound = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_section(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert)
        for test in (node.test.values if isinstance(node.test, ast.BoolOp) else [node.test])
        if isinstance(test, ast.Compare)
        and isinstance(test.ops[0], ast.IsNot)
        and (_is_section(test.left) or (isinstance(test.left, ast.Name) and test.left.id in bound))
    ]


def _is_section(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in SECTIONS and node.attr != "ec2"


def test_the_scan_finds_an_assert_on_the_section_or_on_a_name_bound_to_it():
    assert asserted_sections(
        ast.parse("assert settings.gateway is not None and settings.local is not None")
    ) == [1]
    assert asserted_sections(ast.parse("k = settings.kubernetes\nassert k is not None")) == [2]
    assert (
        asserted_sections(ast.parse("k = settings.section(Kubernetes)\nassert settings.gateway is not None"))
        == []
    )
