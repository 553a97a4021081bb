"""An offline pool in a stack file: a ``frontier:models`` entry with ``offline_for`` takes the batch
work of another model, on a node group of its own. The gateway's config routes that model's batch
requests to it, its runtimes answer to that model's name, and what would make it a different model or
unroutable is refused at load naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from frontier_gateway.config import parse_config

from frontier.access.gateway import render_gateway_config, static_replicas
from frontier.errors import StackError
from frontier.render.host import runtime_config_for
from frontier.targets import load_stack
from frontier.targets.kubernetes.gateway import gateway_yaml as kubernetes_gateway_yaml
from frontier.targets.kubernetes.manifests import render_workload

MODEL, OFFLINE = "llama-3.1-8b-instruct", "llama-3.1-8b-batch"
DIGEST = "sha256:" + "ab" * 32


def with_offline_pool(edit=lambda config, batch: None) -> dict:
    """eks-gateway's file with an offline pool for its 8B model on a scale-to-zero group of its own;
    ``edit(config, batch_entry)`` changes it before it is written."""
    document = yaml.safe_load(Path(load_stack("eks-gateway").source).read_text())
    config = document["config"]
    interactive = next(m for m in config["frontier:models"] if m["model"]["name"] == MODEL)
    batch = {key: copy.deepcopy(value) for key, value in interactive.items() if key != "disaggregation"}
    batch["model"]["name"] = OFFLINE
    batch["runtime"]["api_keys_secret"] = f"frontier/eks-gateway/{OFFLINE}/api-keys"
    batch.update(offline_for=MODEL, node_group="l40s-batch")
    config["frontier:models"].append(batch)
    group = copy.deepcopy(next(g for g in config["frontier:node_groups"] if g["name"] == "l40s"))
    config["frontier:node_groups"].append({**group, "name": "l40s-batch"})
    node_pools = config["frontier:kubernetes"]["node_pools"]
    node_pool = copy.deepcopy(next(n for n in node_pools if n["name"] == "l40s"))
    node_pools.append(
        {
            **node_pool,
            "name": "l40s-batch",
            "node_group": "l40s-batch",
            "labels": {"frontier.dev/pool": "l40s-batch"},
        }
    )
    # Batch work waits while a replica of the scaled-to-zero group starts.
    config["frontier:gateway"]["hold"][OFFLINE] = {"max_requests": 1000, "timeout_s": 240}
    edit(config, batch)
    return document


def load(document: dict, tmp_path: Path):
    path = tmp_path / "Pulumi.eks-gateway.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack("eks-gateway", path=path)


def offline_of(gateway_yaml: str) -> dict[str, str]:
    """Each model's offline pool in a rendered gateway.yaml, as the gateway reads it."""
    return {pool.name: pool.offline for pool in parse_config(gateway_yaml).models}


def test_the_gateway_sends_the_models_batch_work_to_its_offline_pool_on_kubernetes_and_ec2(tmp_path):
    settings = load(with_offline_pool(), tmp_path)
    expected = {"llama-3.1-70b-instruct": "", MODEL: OFFLINE, OFFLINE: ""}
    assert offline_of(kubernetes_gateway_yaml(settings)) == expected  # its pools found by EndpointSlices
    assert offline_of(render_gateway_config(settings, None)) == expected  # on EC2: by their groups' tags


def test_the_local_gateway_sends_the_models_batch_work_to_the_offline_pools_slots(tmp_path):
    settings = local_with_offline_pool(tmp_path, gateway=True)
    config = parse_config(render_gateway_config(settings, static_replicas(settings)))
    by_name = {pool.name: pool for pool in config.models}
    assert by_name["tiny-llama"].offline == "tiny-llama-batch"
    assert by_name["tiny-llama-batch"].replicas == ("http://127.0.0.4:8001",)


def test_the_offline_pools_runtimes_answer_to_the_models_name_and_no_other_pools_do(tmp_path):
    settings = load(with_offline_pool(), tmp_path)
    aliases = {pool.name: runtime_config_for(settings, pool).model.aliases for pool in settings.pools}
    assert aliases == {"llama-3.1-70b-instruct": (), MODEL: (), OFFLINE: (MODEL,)}
    [config_map] = [
        o
        for o in render_workload(settings, DIGEST).all()
        if o.kind == "ConfigMap" and "8b-batch-config" in o.name
    ]
    runtime_yaml = yaml.safe_load(next(iter(config_map.to_dict()["data"].values())))
    assert runtime_yaml["model"]["aliases"] == [MODEL]


def refused(document: dict, tmp_path: Path) -> str:
    with pytest.raises(StackError) as error:
        load(document, tmp_path)
    return str(error.value)


@pytest.mark.parametrize(
    ("offline_for", "says"),
    [
        ("llama-9", "models[2].offline_for = 'llama-9': must name another model of the stack"),
        (OFFLINE, f"models[2].offline_for = '{OFFLINE}': must name another model of the stack"),
    ],
)
def test_an_offline_pool_must_name_another_model(tmp_path, offline_for, says):
    assert says in refused(
        with_offline_pool(lambda c, batch: batch.update(offline_for=offline_for)), tmp_path
    )


def test_an_offline_pool_of_an_offline_pool_is_refused(tmp_path):
    def chain(config, batch):
        second = copy.deepcopy(batch)
        second["model"]["name"] = "llama-3.1-8b-batch-2"
        second["runtime"]["api_keys_secret"] = "frontier/eks-gateway/llama-3.1-8b-batch-2/api-keys"
        second.update(offline_for=OFFLINE, node_group="l40s-prefill")
        config["frontier:models"].append(second)

    message = refused(with_offline_pool(chain), tmp_path)
    assert f"models[3].offline_for = '{OFFLINE}': names an offline pool itself" in message


def test_a_second_offline_pool_for_one_model_is_refused(tmp_path):
    def twice(config, batch):
        second = copy.deepcopy(batch)
        second["model"]["name"] = "llama-3.1-8b-batch-2"
        second["runtime"]["api_keys_secret"] = "frontier/eks-gateway/llama-3.1-8b-batch-2/api-keys"
        config["frontier:models"].append(second)

    assert "a model has one offline pool" in refused(with_offline_pool(twice), tmp_path)


def test_an_offline_pool_of_other_weights_is_refused(tmp_path):
    def other_weights(config, batch):
        batch["model"]["version"] = "2025-01-01"

    message = refused(with_offline_pool(other_weights), tmp_path)
    assert (
        "models[2].model.weights_uri" in message
        and "batch requests for that model get its answers" in message
    )


def test_a_stack_writing_model_aliases_is_refused(tmp_path):
    def aliases(config, batch):
        batch["model"]["aliases"] = [MODEL]

    assert "models[2].model.aliases = ['llama-3.1-8b-instruct']: is not written in a stack" in refused(
        with_offline_pool(aliases), tmp_path
    )


def local_with_offline_pool(tmp_path: Path, *, gateway: bool):
    """The local stack's model on host-1 and host-2, its offline pool on host-3 (at port 8001)."""
    settings = load_stack("local")
    document = yaml.safe_load(Path(settings.source).read_text())
    config = document["config"]
    pool = {key: config.pop(f"frontier:{key}") for key in ("model", "runtime")}
    batch = copy.deepcopy(pool)
    batch["model"]["name"] = "tiny-llama-batch"
    batch["runtime"].update(api_keys_secret="frontier/local/batch-api-keys", port=8001)
    config["frontier:models"] = [
        {**pool, "hosts": ["host-1", "host-2"]},
        {**batch, "hosts": ["host-3"], "offline_for": pool["model"]["name"]},
    ]
    if gateway:
        config["frontier:gateway"] = {
            "port": 8090,
            "admin_port": 8091,
            "metering": {"uri": str(tmp_path / "m.jsonl")},
        }
        config["frontier:tenants"] = [
            {
                "name": "nightly",
                "api_key_secret": "frontier/local/tenants/nightly",
                "models": ["tiny-llama"],
                "requests_per_minute": 600,
                "tokens_per_minute": 200_000,
                "max_concurrent_requests": 16,
                "priority": "batch",
            }
        ]
    path = tmp_path / "Pulumi.local.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_stack("local", path=path)


def test_an_offline_pool_without_a_gateway_is_refused(tmp_path):
    with pytest.raises(StackError, match="offline_for = 'tiny-llama': needs the stack's gateway"):
        local_with_offline_pool(tmp_path, gateway=False)
