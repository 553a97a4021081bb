"""A pool can run its prefill and decode halves on node groups of their own: the file names each
half's group and replica count, the pool's node group is its decode group, each group's hosts run
their half's runtime role, and a layout that cannot run is refused naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from frontier.errors import StackError
from frontier.targets import load_stack

SMALL_MODEL = 1  # eks-gateway's 8B pool: one rank per replica, so its KV can move between replicas


@pytest.fixture(scope="module")
def document() -> dict:
    return yaml.safe_load(Path(load_stack("eks-gateway").source).read_text())


def _with(document: dict, tmp_path: Path, **pool_fields: object) -> Path:
    """eks-gateway with a prefill group beside l40s (in place of the one it ships) and
    ``pool_fields`` on its 8B pool, colocated unless they say otherwise."""
    doc = copy.deepcopy(document)
    config = doc["config"]
    groups = [g for g in config["frontier:node_groups"] if g["name"] != "l40s-prefill"]
    (l40s,) = [g for g in groups if g["name"] == "l40s"]
    config["frontier:node_groups"] = [
        *groups,
        {**l40s, "name": "l40s-prefill", "instance_type": "g6e.2xlarge"},
    ]
    config["frontier:models"][SMALL_MODEL].pop("disaggregation", None)
    config["frontier:models"][SMALL_MODEL].update(pool_fields)
    path = tmp_path / "Pulumi.eks-gateway.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


HALVES = {
    "prefill": {"node_group": "l40s-prefill", "replicas": 2},
    "decode": {"node_group": "l40s", "replicas": 3},
}


def test_a_disaggregated_pool_holds_both_groups_and_their_replica_counts(document, tmp_path):
    settings = load_stack("eks-gateway", path=_with(document, tmp_path, disaggregation=HALVES))
    pool = settings.pools[SMALL_MODEL]
    assert pool.disaggregation is not None
    assert (pool.disaggregation.prefill.group.name, pool.disaggregation.prefill.replicas) == (
        "l40s-prefill",
        2,
    )
    assert (pool.disaggregation.decode.group.name, pool.disaggregation.decode.replicas) == ("l40s", 3)
    assert [g.name for g in pool.groups] == ["l40s-prefill", "l40s"]
    assert pool.disaggregation.prefill.group.instance_type == "g6e.2xlarge"


def test_the_pools_node_group_is_its_decode_group_when_left_out(document, tmp_path):
    path = _with(document, tmp_path, disaggregation=HALVES)
    doc = yaml.safe_load(path.read_text())
    del doc["config"]["frontier:models"][SMALL_MODEL]["node_group"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert load_stack("eks-gateway", path=path).pools[SMALL_MODEL].group.name == "l40s"


def test_each_groups_hosts_run_their_halfs_runtime_role(document, tmp_path):
    settings = load_stack("eks-gateway", path=_with(document, tmp_path, disaggregation=HALVES))
    pool = settings.pools[SMALL_MODEL]
    roles = {g.name: pool.runtime_on(g).kv_transfer.role for g in settings.node_groups}
    assert roles == {"h100": "both", "l40s": "decode", "l40s-prefill": "prefill"}
    assert pool.runtime_on(pool.group).port == pool.runtime.port


def test_the_pool_runs_on_both_groups_for_whoever_asks_which_pools_a_group_runs(document, tmp_path):
    settings = load_stack("eks-gateway", path=_with(document, tmp_path, disaggregation=HALVES))
    (prefill,) = [g for g in settings.node_groups if g.name == "l40s-prefill"]
    assert [p.name for p in settings.pools_on(prefill)] == ["llama-3.1-8b-instruct"]


def test_new_node_groups_reach_both_halves(document, tmp_path):
    settings = load_stack("eks-gateway", path=_with(document, tmp_path, disaggregation=HALVES))
    groups = tuple(g.model_copy(update={"max_size": 7}) for g in settings.node_groups)
    pool = settings.model_copy(update={"node_groups": groups}).pools[SMALL_MODEL]
    assert pool.disaggregation is not None
    assert pool.disaggregation.prefill.group.max_size == pool.disaggregation.decode.group.max_size == 7


def _refusal(document: dict, tmp_path: Path, **pool_fields: object) -> str:
    with pytest.raises(StackError) as refused:
        load_stack("eks-gateway", path=_with(document, tmp_path, **pool_fields))
    return str(refused.value)


def test_both_halves_on_one_group_are_refused(document, tmp_path):
    halves = {**HALVES, "prefill": {"node_group": "l40s", "replicas": 2}}
    assert "models[1].disaggregation.prefill.node_group" in _refusal(
        document, tmp_path, disaggregation=halves
    )


def test_a_half_on_an_unknown_group_is_refused_naming_the_groups(document, tmp_path):
    halves = {**HALVES, "prefill": {"node_group": "a100", "replicas": 2}}
    message = _refusal(document, tmp_path, disaggregation=halves)
    assert "models[1].disaggregation.prefill.node_group" in message
    assert "h100, l40s, l40s-prefill" in message


def test_a_half_on_another_pools_group_is_refused(document, tmp_path):
    halves = {**HALVES, "prefill": {"node_group": "h100", "replicas": 2}}
    message = _refusal(document, tmp_path, disaggregation=halves)
    assert "also runs pool 'llama-3.1-70b-instruct'" in message


def test_a_node_group_other_than_the_decode_group_is_refused(document, tmp_path):
    message = _refusal(document, tmp_path, disaggregation=HALVES, node_group="l40s-prefill")
    assert "decode group ('l40s')" in message


def test_pool_replicas_beside_halves_are_refused(document, tmp_path):
    assert "per role" in _refusal(document, tmp_path, disaggregation=HALVES, replicas=2)


def test_a_runtime_role_written_by_hand_is_refused(document, tmp_path):
    runtime = {
        **document["config"]["frontier:models"][SMALL_MODEL]["runtime"],
        "kv_transfer": {"role": "decode"},
    }
    message = _refusal(document, tmp_path, disaggregation=HALVES, runtime=runtime)
    assert "kv_transfer.role" in message


def test_a_replica_of_several_ranks_is_refused(document, tmp_path):
    runtime = {**document["config"]["frontier:models"][SMALL_MODEL]["runtime"], "tensor_parallel_size": 2}
    assert "one rank each" in _refusal(document, tmp_path, disaggregation=HALVES, runtime=runtime)


def test_the_local_stack_refuses_disaggregation_naming_the_bench(tmp_path):
    doc = yaml.safe_load(Path(load_stack("local").source).read_text())
    (cpu,) = doc["config"]["frontier:node_groups"]
    doc["config"]["frontier:node_groups"].append({**cpu, "name": "cpu-prefill"})
    doc["config"]["frontier:disaggregation"] = {
        "prefill": {"node_group": "cpu-prefill", "replicas": 1},
        "decode": {"node_group": "cpu", "replicas": 1},
    }
    path = tmp_path / "Pulumi.local.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(StackError) as refused:
        load_stack("local", path=path)
    assert "the local stack runs colocated replicas" in str(refused.value)
