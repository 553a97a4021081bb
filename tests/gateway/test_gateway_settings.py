"""Several models and tenants in one stack file: what loads, and what is refused naming field and range."""

from __future__ import annotations

from pathlib import Path

import pytest
from frontier_gateway.config import parse_config

from frontier.access.gateway import render_gateway_config, static_replicas
from frontier.config.load import available_stacks
from frontier.errors import StackError
from frontier.targets import load_stack
from tests.gateway.stacks import two_model_config, write_stack


def _load(tmp_path: Path, document: dict):
    return load_stack("local", path=write_stack(tmp_path, document))


SINGLE_MODEL_STACKS = [s for s in available_stacks() if not load_stack(s).listed_models]


@pytest.mark.parametrize("stack", SINGLE_MODEL_STACKS)
def test_every_single_model_stack_is_a_one_pool_list(stack: str) -> None:
    settings = load_stack(stack)
    (pool,) = settings.pools
    assert pool.group == settings.node_groups[0] and pool.hosts == settings.inventory.hosts
    assert settings.tenants == () and settings.gateway is None


def test_two_models_load_with_their_own_hosts_and_runtime(tmp_path: Path) -> None:
    settings = _load(tmp_path, two_model_config())
    assert [pool.name for pool in settings.pools] == ["tiny-llama", "tiny-llama-small"]
    big, small = settings.pools
    assert small.model.hidden_size == 128
    assert [host.name for host in small.hosts] == ["host-3"]
    assert [host.name for host in big.hosts] == ["host-1", "host-2"]
    assert [host.name for host in settings.for_pool("tiny-llama-small").inventory.hosts] == ["host-3"]
    assert [t.priority for t in settings.tenants] == ["interactive", "batch"]
    with pytest.raises(KeyError, match="serves tiny-llama, tiny-llama-small"):
        settings.pool("gpt-4")


def test_a_stack_of_two_models_has_no_one_model_to_read(tmp_path: Path) -> None:
    settings = _load(tmp_path, two_model_config())
    with pytest.raises(StackError, match="serves 2 models"):
        settings.model  # noqa: B018 (the read itself is refused)


def _refused(tmp_path: Path, document: dict) -> str:
    with pytest.raises(StackError) as info:
        _load(tmp_path, document)
    return str(info.value)


def test_a_tenant_naming_an_unknown_model_is_refused(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:tenants"][1]["models"] = ["tiny-llama-small", "llama-405b"]
    message = _refused(tmp_path, document)
    assert "tenants[1].models[1] = 'llama-405b'" in message
    assert "must name a model this stack serves (tiny-llama, tiny-llama-small)" in message


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("requests_per_minute", 0, "greater than or equal to 1"),
        ("tokens_per_minute", 0, "greater than or equal to 1"),
        ("max_concurrent_requests", 0, "greater than or equal to 1"),
        ("priority", "urgent", "'interactive' or 'batch'"),
        ("models", [], "at least 1 item"),
        ("name", "Acme Corp", "should match pattern"),
    ],
)
def test_a_bad_tenant_quota_names_field_value_and_range(
    tmp_path: Path, field: str, value: object, allowed: str
) -> None:
    document = two_model_config()
    document["config"]["frontier:tenants"][0][field] = value
    message = _refused(tmp_path, document)
    assert f"tenants[0].{field} = {value!r}" in message
    assert allowed in message


def test_missing_tenant_settings_are_named(tmp_path: Path) -> None:
    document = two_model_config()
    del document["config"]["frontier:tenants"][0]["tokens_per_minute"]
    del document["config"]["frontier:tenants"][1]["priority"]
    message = _refused(tmp_path, document)
    assert "tenants[0].tokens_per_minute: Field required" in message
    assert "tenants[1].priority: Field required" in message


def test_a_gateway_needs_tenants_and_several_models_need_a_gateway(tmp_path: Path) -> None:
    document = two_model_config()
    del document["config"]["frontier:tenants"]
    assert "tenants = []: a stack with a gateway needs at least one tenant" in _refused(tmp_path, document)
    document = two_model_config()
    del document["config"]["frontier:tenants"]
    del document["config"]["frontier:gateway"]
    assert "gateway: 2 models need a 'frontier:gateway' section" in _refused(tmp_path, document)


def test_a_bad_value_in_a_pool_is_named_once_where_it_was_written(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:models"][0]["model"]["num_layers"] = 0
    message = _refused(tmp_path, document)
    assert "models[0].model.num_layers = 0: Input should be greater than or equal to 1" in message
    assert "\n  model.num_layers" not in message


def test_the_second_pool_gets_the_same_cross_checks(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:models"][1]["model"]["num_kv_heads"] = 3
    document["config"]["frontier:models"][1]["runtime"]["batch"]["max_batch_size"] = 32
    message = _refused(tmp_path, document)
    assert "models[1].model.num_kv_heads = 3: must divide models[1].model.num_attention_heads (4)" in message
    assert (
        "models[1].runtime.batch.max_batch_size = 32: must be <= models[1].runtime.max_concurrency (16)"
        in message
    )


def test_pools_must_split_the_hosts(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:models"][1]["hosts"] = ["host-2", "host-3"]
    message = _refused(tmp_path, document)
    assert "models[1].hosts[0] = 'host-2': already runs model 'tiny-llama'" in message


def test_a_pool_names_hosts_of_the_inventory(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:models"][1]["hosts"] = ["host-3", "host-9"]
    message = _refused(tmp_path, document)
    assert (
        "models[1].hosts[1] = 'host-9': must name one of inventory.hosts (host-1, host-2, host-3, host-4)"
        in message
    )


def test_a_gateway_port_may_not_collide_on_the_local_stack(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:gateway"]["port"] = 8080
    assert "gateway.port = 8080: must differ from the runtime, moto and balancer ports" in _refused(
        tmp_path, document
    )


def test_the_stack_carries_the_admin_port_quota_store_and_breaker_into_gateway_yaml(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:gateway"].update(
        admin_port=9191,
        quota={"store": "redis", "redis_url": "redis://quota.internal:6379/0"},
        breaker={"cool_off_s": 5, "error_rate": 0.25},
    )
    settings = _load(tmp_path, document)
    rendered = parse_config(render_gateway_config(settings, static_replicas(settings)))
    assert (rendered.admin_host, rendered.admin_port) == ("127.0.0.1", 9191)
    assert (rendered.quota.store, rendered.quota.redis_url) == ("redis", "redis://quota.internal:6379/0")
    assert (rendered.breaker.cool_off_s, rendered.breaker.error_rate) == (5, 0.25)


def test_a_bad_breaker_or_quota_store_setting_in_the_stack_is_named(tmp_path: Path) -> None:
    document = two_model_config()
    document["config"]["frontier:gateway"].update(breaker={"error_rate": 2}, quota={"store": "redis"})
    message = _refused(tmp_path, document)
    assert "gateway.breaker.error_rate = 2: Input should be less than or equal to 1" in message
    assert "gateway.quota.redis_url = '': Value error, store 'redis' needs a redis_url" in message
