"""Fixtures for the Pulumi program's tests: one mocked run per stack, shared by every test module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The policy pack (policy/) is a directory of the repository, not an installed package.
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from infra_mocks import CLOUD_STACKS, Graph, graph_for, run_graphs  # noqa: E402


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
    if run_graphs:
        runs = ", ".join(
            f"{stack} {g.seconds:.2f} s wall / {g.cpu_seconds:.2f} s CPU ({len(g.resources)} resources)"
            for stack, g in run_graphs.items()
        )
        terminalreporter.write_line(f"pulumi program under mocks: {runs}")
