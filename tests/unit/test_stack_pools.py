"""Every stack is a list of pools: a one-model file is one pool, a file listing models is those
pools, and a file that writes both shapes is refused naming both keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from frontier.config.load import available_stacks
from frontier.errors import StackError
from frontier.targets import load_stack

# stack -> (model, node group) of each pool, in the order the file gives them.
POOLS = {
    "dev": [("llama-3.2-1b-instruct", "a10g")],
    "eks-gateway": [("llama-3.1-70b-instruct", "h100"), ("llama-3.1-8b-instruct", "l40s")],
    "eks-multinode": [("llama-3.1-405b-instruct", "h100")],
    "eks-prod": [("llama-3.1-70b-instruct", "h100")],
    "local": [("tiny-llama", "cpu")],
    "moe-prod": [("qwen3-235b-a22b", "h200")],
    "prod": [("llama-3.1-70b-instruct", "h100")],
    "prod-multinode": [("llama-3.1-405b-instruct", "h100x2")],
    "staging": [("llama-3.1-8b-instruct", "l40s")],
}


def test_every_stack_file_is_listed_here():
    assert sorted(POOLS) == available_stacks()


@pytest.mark.parametrize("stack", sorted(POOLS))
def test_every_stack_loads_as_its_pools(stack):
    settings = load_stack(stack)
    assert [(pool.name, pool.group.name) for pool in settings.pools] == POOLS[stack]
    for pool in settings.pools:
        assert pool.group in settings.node_groups


def test_a_one_model_pool_runs_on_every_host_of_a_static_inventory():
    settings = load_stack("local")
    (pool,) = settings.pools
    assert pool.hosts == settings.inventory.hosts


def test_a_file_with_models_and_a_top_level_model_is_refused_naming_both(tmp_path):
    document = yaml.safe_load(Path(load_stack("eks-gateway").source).read_text())
    document["config"]["frontier:model"] = document["config"]["frontier:models"][0]["model"]
    path = tmp_path / "Pulumi.eks-gateway.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(StackError) as refused:
        load_stack("eks-gateway", path=path)
    assert "frontier:models and frontier:model:" in str(refused.value)


def test_two_pools_naming_one_key_secret_are_refused_naming_the_field_and_the_other_pool(tmp_path):
    document = yaml.safe_load(Path(load_stack("eks-gateway").source).read_text())
    first, second = document["config"]["frontier:models"]
    second["runtime"]["api_keys_secret"] = first["runtime"]["api_keys_secret"]
    path = tmp_path / "Pulumi.eks-gateway.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(StackError) as refused:
        load_stack("eks-gateway", path=path)
    message = str(refused.value)
    assert "models[1].runtime.api_keys_secret" in message
    assert first["runtime"]["api_keys_secret"] in message
    assert f"models[0] ('{first['model']['name']}')" in message


def test_each_pool_of_a_stack_names_its_own_key_secret():
    secrets = load_stack("eks-gateway").api_keys_secrets
    assert len(set(secrets.values())) == len(secrets) == 2
