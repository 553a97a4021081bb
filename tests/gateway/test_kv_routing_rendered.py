"""A pool whose runtimes publish KV events (``runtime.kv_events``) is routed by them: the stack's
``gateway.yaml`` carries the pool's ``kv_routing``, read off the pool's own runtime section and
weights version, and a stack with nobody to read the events refuses them at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from frontier_gateway.config import KvRoutingConfig, parse_config

from frontier.access.gateway import render_gateway_config, static_replicas
from frontier.errors import StackError
from frontier.targets import load_stack
from tests.gateway.stacks import two_model_config, write_stack


def _with_events(document: dict[str, Any], pool: int = 1, **events: Any) -> dict[str, Any]:
    runtime = document["config"]["frontier:models"][pool]["runtime"]
    runtime["kv_events"] = {"enabled": True, **events}
    return document


def _rendered(tmp_path: Path, document: dict[str, Any]) -> dict[str, KvRoutingConfig | None]:
    settings = load_stack("local", path=write_stack(tmp_path, document))
    config = parse_config(render_gateway_config(settings, static_replicas(settings)))
    return {pool.name: pool.kv_routing for pool in config.models}


def test_a_pool_publishing_kv_events_is_routed_by_them_with_its_own_ports_and_block_size(tmp_path) -> None:
    # tiny-llama-small runs on one local slot (host-3); tiny-llama's runtimes publish nothing.
    document = _with_events(two_model_config(), port=6101, replay_port=6102)
    document["config"]["frontier:models"][1]["runtime"]["block_size"] = 32
    routing = _rendered(tmp_path, document)
    small = routing["tiny-llama-small"]
    assert small is not None
    assert (small.block_size, small.events_port, small.replay_port) == (32, 6101, 6102)
    # The tokenizer comes from the weights version the pool's runtimes load.
    source = "s3://frontier-local-weights/tiny-llama-small/v1"
    assert (small.tokenizer_source, small.tokenizer_dir) == (source, "")
    assert routing["tiny-llama"] is None


def test_moving_a_pools_ports_or_block_size_moves_its_gateways_config(tmp_path) -> None:
    first = _rendered(tmp_path / "a", _with_events(two_model_config(), port=6101, replay_port=6102))
    document = _with_events(two_model_config(), port=7101, replay_port=7102)
    document["config"]["frontier:models"][1]["runtime"]["block_size"] = 8
    document["config"]["frontier:models"][1]["model"]["version"] = "v2"
    second = _rendered(tmp_path / "b", document)
    before, after = first["tiny-llama-small"], second["tiny-llama-small"]
    assert before is not None and after is not None
    assert (before.events_port, before.replay_port, before.block_size) == (6101, 6102, 16)
    assert (after.events_port, after.replay_port, after.block_size) == (7101, 7102, 8)
    assert after.tokenizer_source == "s3://frontier-local-weights/tiny-llama-small/v2"


def test_kv_events_without_a_gateway_are_refused_at_load_naming_the_field(tmp_path) -> None:
    import yaml

    from frontier import project

    document = yaml.safe_load((project.root() / "stacks" / "Pulumi.local.yaml").read_text())
    document["config"]["frontier:runtime"]["kv_events"] = {"enabled": True}
    with pytest.raises(StackError) as info:
        load_stack("local", path=write_stack(tmp_path, document))
    assert "runtime.kv_events.enabled = True: needs a 'frontier:gateway' section" in str(info.value)


def test_a_kv_routing_names_its_tokenizer_once_either_a_directory_or_s3() -> None:
    for both_or_none in ({}, {"tokenizer_dir": "/m", "tokenizer_source": "s3://bucket/m/v1"}):
        with pytest.raises(ValueError, match="one of the two"):
            KvRoutingConfig.model_validate(both_or_none)
    with pytest.raises(ValueError, match="tokenizer_source"):
        KvRoutingConfig.model_validate({"tokenizer_source": "/not/s3"})


def test_the_local_stack_refuses_kv_events_on_a_pool_of_several_slots_sharing_the_machine(tmp_path) -> None:
    # Both of tiny-llama's slots would bind the same event ports on this one machine.
    with pytest.raises(StackError) as info:
        load_stack("local", path=write_stack(tmp_path, _with_events(two_model_config(), pool=0)))
    assert "models[0].runtime.kv_events.enabled = True: the local slots ['host-1', 'host-2'] share" in str(
        info.value
    )


def test_kv_events_need_the_prefix_cache_they_report(tmp_path) -> None:
    document = _with_events(two_model_config(), pool=1)
    document["config"]["frontier:models"][1]["runtime"]["prefix_caching"] = False
    with pytest.raises(StackError) as info:
        load_stack("local", path=write_stack(tmp_path, document))
    assert "models[1].runtime.kv_events.enabled = True: needs runtime.prefix_caching" in str(info.value)
