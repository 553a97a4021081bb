"""Fixtures for the Pulumi program's tests: one mocked run per stack, shared by every test module."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from frontier.stack import load_stack

# The policy pack (policy/) is a directory of the repository, not an installed package.
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra_mocks import Graph, run_program  # noqa: E402

MAIN = REPO / "infra" / "__main__.py"
CLOUD_STACKS = ("dev", "staging", "prod")
_graphs: dict[str, Graph] = {}


def run_main(stack: str, settings=None) -> Graph:
    """Run ``infra/__main__.py`` as ``pulumi up -s <stack>`` does; ``settings`` only sets up the mocks."""
    settings = (settings or load_stack(stack)).model_copy(update={"stack": stack})
    return run_program(settings, program=lambda _: runpy.run_path(str(MAIN)))


def graph_for(stack: str) -> Graph:
    """The program's resources and exported outputs for a stack, built once per test session."""
    if stack not in _graphs:
        _graphs[stack] = run_main(stack)
    return _graphs[stack]


@pytest.fixture(params=CLOUD_STACKS)
def graph(request: pytest.FixtureRequest) -> Graph:
    return graph_for(request.param)


@pytest.fixture
def dev() -> Graph:
    return graph_for("dev")


@pytest.fixture
def staging() -> Graph:
    return graph_for("staging")


@pytest.fixture
def prod() -> Graph:
    return graph_for("prod")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if _graphs:
        runs = ", ".join(
            f"{stack} {g.seconds:.2f} s ({len(g.resources)} resources)" for stack, g in _graphs.items()
        )
        terminalreporter.write_line(f"pulumi program under mocks: {runs}")
