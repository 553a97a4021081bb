"""Rollouts per model: ``--model`` narrows a stack to one pool's hosts, runtime and history."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from frontier.cli.common import pool_settings
from frontier.errors import StackError
from frontier.release.history import stack_history
from frontier.render.host import render_runtime_config
from frontier.targets import backend_for
from tests.gateway.stacks import two_model_config, write_stack

FAB = str(Path(sys.executable).with_name("fab"))


@pytest.fixture
def two_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stacks = tmp_path / "stacks"
    write_stack(stacks, two_model_config())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks))
    return stacks


def test_one_pool_is_its_own_hosts_runtime_and_history(two_models: Path) -> None:
    small = pool_settings("local", "tiny-llama-small")
    backend = backend_for(small)
    assert [h.name for h in backend.hosts()] == ["host-3"]
    assert small.model.hidden_size == 128
    store = stack_history(small, "tiny-llama-small", backend.aws_client("s3"), "frontier-local-history", "history/local/")
    assert store.prefix == "history/local/models/tiny-llama-small/"
    assert store.artifacts_prefix == "history/local/"  # one release.build serves every pool
    big = pool_settings("local", "tiny-llama")
    assert [h.name for h in backend_for(big).hosts()] == ["host-1", "host-2"]
    assert stack_history(big, "tiny-llama", None, "b", "history/local/").prefix == "history/local/models/tiny-llama/"
    # Each pool renders its own runtime.yaml, hence its own release id.
    assert render_runtime_config(small, small.only_pool) != render_runtime_config(big, big.only_pool)


def test_a_one_model_stack_keeps_its_history_where_it_was() -> None:
    settings = pool_settings("local", None)
    assert stack_history(settings, "tiny-llama", None, "b", "history/local/").prefix == "history/local/"
    assert pool_settings("local", "tiny-llama").inventory == settings.inventory


def test_a_stack_of_several_models_needs_model_to_roll(two_models: Path) -> None:
    with pytest.raises(StackError, match=r"serves 2 models \(tiny-llama, tiny-llama-small\): name the pool"):
        pool_settings("local", None)
    env = {**os.environ, "FRONTIER_STACKS_DIR": str(two_models), "FRONTIER_STACK": ""}
    digest = "sha256:" + "a" * 64
    done = subprocess.run(
        [FAB, "deploy", "-s", "local", "--digest", digest, "--model", "gpt-4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        "--model: model 'gpt-4' is not served by stack 'local': it serves tiny-llama, tiny-llama-small"
        in done.stderr
    )


def test_the_gateway_config_of_a_stack_is_what_the_gateway_accepts(two_models: Path) -> None:
    from frontier_gateway.config import parse_config

    from frontier.access.gateway import render_gateway_config, static_replicas
    from frontier.targets import load_stack

    settings = load_stack("local")
    config = parse_config(render_gateway_config(settings, static_replicas(settings)))
    assert {m.name: m.replicas for m in config.models} == {
        "tiny-llama": ("http://127.0.0.2:8000", "http://127.0.0.3:8000"),
        "tiny-llama-small": ("http://127.0.0.4:8000",),
    }
    assert [(t.name, t.api_key_secret, t.priority) for t in config.tenants] == [
        ("acme", "frontier/local/tenants/acme", "interactive"),
        ("nightly", "frontier/local/tenants/nightly", "batch"),
    ]
    assert {m.name: m.api_keys_secret for m in config.models} == {
        "tiny-llama": "frontier/local/api-keys",
        "tiny-llama-small": "frontier/local/tiny-llama-small/api-keys",
    }
    assert not any(
        "sk-" in line for line in render_gateway_config(settings, static_replicas(settings)).splitlines()
    )
