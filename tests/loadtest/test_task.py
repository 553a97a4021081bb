"""``fab loadtest`` refuses bad options with a message naming the option and what is allowed."""

from __future__ import annotations

import shutil
import socket

import pytest
from invoke import Context
from invoke.exceptions import Exit

from frontier import project
from frontier.capacity.baseline import load_baseline
from frontier.cli.local import loadtest
from tests.loadtest.sse_server import SseServer


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"step": "1,x"}, "--step '1,x': expected comma-separated rates"),
        ({"step": "2,0"}, "--step '2,0': every rate must be > 0"),
        ({"rate": 1, "concurrency": 2}, "give one of --rate, --step or --concurrency"),
        ({"endpoint": "embeddings"}, "--endpoint 'embeddings': must be 'completions' or 'chat'"),
        ({"replicas": 0}, "--replicas 0: must be >= 1"),
        ({"prompt_tokens": "64,abc"}, "--prompt-tokens 64,abc: give a number of tokens, or several"),
        ({"prompt_tokens": "64,0"}, "--prompt-tokens 64,0: each length must be 1..1048576 tokens"),
    ],
)
def test_bad_options_exit_2_naming_the_option(options, message):
    with pytest.raises(Exit) as exit_:
        loadtest(Context(), stack="local", url="http://127.0.0.1:9", **options)
    assert exit_.value.code == 2
    assert message in str(exit_.value.message)


def test_a_cloud_stack_needs_the_balancer_url():
    with pytest.raises(Exit) as exit_:
        loadtest(Context(), stack="prod", rate=1)
    assert "give --url" in str(exit_.value.message)


@pytest.fixture
def stack_copy(tmp_path, monkeypatch):
    """A copy of the stacks folder, so a saved baseline lands in tmp and not in stacks/baselines."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    shutil.copy((project.root() / "stacks") / "Pulumi.local.yaml", stacks)
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks))
    return stacks


def test_a_step_load_finds_the_knee_plots_it_and_saves_the_baseline(stack_copy, tmp_path, capsys):
    with SseServer(tokens=4, first_s=0.01, gap_s=0.005) as server:
        loadtest(
            Context(),
            stack="local",
            url=server.url,
            step="4,8",
            step_duration=1.5,
            out=str(tmp_path),
            release="r-0123456789ab",
        )
    shown = capsys.readouterr().out
    assert "knee: 8 req/s per endpoint" in shown
    assert (tmp_path / "latency-vs-load.png").exists()
    baseline = load_baseline("local")
    assert baseline is not None
    assert (baseline.replica_qps, baseline.hosts_measured, baseline.release_id) == (8.0, 1, "r-0123456789ab")


def test_a_step_load_where_nothing_holds_exits_1_and_saves_nothing(stack_copy, tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # refuses every connection
        with pytest.raises(Exit) as exit_:
            loadtest(Context(), stack="local", url=url, step="4", step_duration=0.5, out=str(tmp_path))
    assert exit_.value.code == 1
    assert load_baseline("local") is None
