"""What the Kubernetes target refuses for a replica over several nodes: a pod's share of the
replica's GPUs must fit one node of its pool, and replicas count ``runtime.nodes_per_replica``
nodes each against the node group's max_size. Every refusal names the field, its value and the
numbers (through the loader, as ``pulumi up`` and every ``fab`` task meet them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frontier.errors import StackError
from frontier.targets import load_stack
from frontier.targets.kubernetes import rules


def _refused(path: Path, field: str) -> str:
    with pytest.raises(StackError) as err:
        load_stack("eks-multinode", path=path)
    lines = [line.strip() for line in str(err.value).splitlines() if line.strip().startswith(field + " ")]
    assert lines, f"no problem names {field!r} in:\n{err.value}"
    return lines[0]


def test_the_multinode_stack_loads_with_no_problems():
    settings = load_stack("eks-multinode")
    assert (settings.runtime.nodes_per_replica, settings.serving_group.gpus_per_node) == (2, 8)
    assert list(rules.stack_problems(settings)) == []


def test_a_pods_share_of_the_replica_must_fit_a_node_of_the_pool(multinode_stack):
    # 16 GPUs over 2 nodes: 8 per pod, more than a g6e.12xlarge's 4.
    line = _refused(
        multinode_stack({"kubernetes.node_pools[0].instance_types": ["p5.48xlarge", "g6e.12xlarge"]}),
        "kubernetes.node_pools[0].instance_types[1]",
    )
    assert "'g6e.12xlarge'" in line and "requests 8 nvidia.com/gpu" in line
    assert "pipeline 2 x max(tensor 8, expert 1) parallel / runtime.nodes_per_replica 2" in line
    assert "has 4" in line and "at most 4" in line


def test_replicas_count_in_nodes_against_the_node_groups_max_size(multinode_stack):
    # 5 replicas x 2 nodes + 1 surging replica x 2 nodes = 12 nodes; the group has 10.
    line = _refused(
        multinode_stack({"kubernetes.autoscaling.max_replicas": 5}), "kubernetes.autoscaling.max_replicas"
    )
    assert "= 5:" in line and "nodes_per_replica = 2" in line
    assert "= 12 nodes" in line and "max_size 10" in line and "at most 4" in line


def test_a_surging_replica_needs_room_for_all_its_nodes(multinode_stack):
    # 4 replicas x 2 nodes fill 8 of 9; the rollout's surging replica needs 2 more.
    path = multinode_stack({"node_groups[0].max_size": 9, "node_groups[0].schedule": None})
    line = _refused(path, "kubernetes.autoscaling.max_replicas")
    assert "= 10 nodes" in line and "max_size 9" in line and "at most 3" in line


def test_a_model_name_too_long_for_its_groups_statefulsets_is_refused(multinode_stack):
    name = "llama-3.1-405b-instruct-with-a-long-fine-tune-name"
    line = _refused(multinode_stack({"model.name": name}), "model.name")
    assert repr(name) in line and "at most 52" in line and "shorten" in line
