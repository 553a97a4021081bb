"""Two parallel-layout rules that the planner, the stack check and the Kubernetes pod agree on:
pipeline stages hold equal shares of the layers, and a replica takes PP x max(TP, EP) GPUs."""

from __future__ import annotations

import pytest

from frontier.capacity.roofline import Replica, Shape
from frontier.errors import FrontierError, StackError
from frontier.targets import load_stack
from frontier.targets.kubernetes.manifests import gpus_per_pod

# eks-prod's 80-layer model made a mixture of experts (16 experts, top-2), so expert parallelism applies.
MOE = {
    "model.num_experts": 16,
    "model.num_experts_per_token": 2,
    "model.moe_intermediate_size": 2048,
    "runtime.batch.max_batch_size": 16,  # KV cache small enough for the GPUs at TP 4
}


def _problem_lines(err: pytest.ExceptionInfo[StackError], field: str) -> list[str]:
    return [line for line in str(err.value).splitlines() if field in line]


def test_pipeline_parallel_must_divide_the_layer_count_in_the_stack(changed_stack):
    """The engine would accept 80 layers over 3 stages (27, 27, 26); the planner times equal stages,
    so the stack is refused naming both numbers."""
    path = changed_stack("prod", {"runtime.tensor_parallel_size": 2, "runtime.pipeline_parallel_size": 3})
    with pytest.raises(StackError) as err:
        load_stack("prod", path=path)
    lines = _problem_lines(err, "runtime.pipeline_parallel_size = 3")
    assert lines and "must divide model.num_layers (80)" in lines[0]


def test_pipeline_parallel_must_divide_the_layer_count_in_the_roofline():
    """A replica built by hand (the bench, explore) is held to the same rule."""
    shape = Shape(layers=10, hidden=256, intermediate=512, heads=8, kv_heads=4, vocab=4096, dtype_bytes=4)
    with pytest.raises(FrontierError, match=r"pipeline_parallel = 4: must divide the model's 10 layers"):
        Replica(shape, 1, 0, 8, 1024, 8, True, pipeline_parallel=4)


def test_a_kubernetes_pod_requests_pipeline_times_expert_parallel_gpus_when_ep_exceeds_tp(changed_stack):
    """TP 4, EP 8, PP 1: a stage spans 8 GPUs, so the pod asks for 8, not TP x PP = 4."""
    path = changed_stack(
        "eks-prod",
        {**MOE, "runtime.tensor_parallel_size": 4, "runtime.expert_parallel_size": 8},
    )
    settings = load_stack("eks-prod", path=path)
    assert gpus_per_pod(settings.only_pool) == 8


def test_a_kubernetes_pod_larger_than_a_node_when_ep_exceeds_tp_is_refused_naming_the_numbers(changed_stack):
    """TP 4 x PP 2 = 8 GPUs would fit an 8-GPU node, but the pod takes PP 2 x EP 8 = 16."""
    path = changed_stack(
        "eks-prod",
        {
            **MOE,
            "runtime.tensor_parallel_size": 4,
            "runtime.expert_parallel_size": 8,
            "runtime.pipeline_parallel_size": 2,
        },
    )
    with pytest.raises(StackError) as err:
        load_stack("eks-prod", path=path)
    assert "a runtime pod requests 16 nvidia.com/gpu (pipeline 2 x max(tensor 4, expert 8) parallel)" in str(
        err.value
    )
    assert "has 8; allowed: at most 8" in str(err.value)
