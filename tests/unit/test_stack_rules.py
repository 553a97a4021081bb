"""Every validation rule of a stack file: a bad value fails at load time naming field and value.

Each case changes one value in a copy of a real stack file and loads it with ``load_stack``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from frontier import project
from frontier.config.load import available_stacks
from frontier.errors import StackError
from frontier.targets import load_stack

FAB = str(Path(sys.executable).with_name("fab"))

# (stack, field, bad value, what the message must say about the allowed range)
FIELD_RULES = [
    ("prod", "region", "mars-1", "should match pattern"),
    ("prod", "network.availability_zones", 1, "greater than or equal to 2"),
    ("prod", "network.availability_zones", 7, "less than or equal to 6"),
    ("prod", "network.vpc_cidr", "10.0.0.0/8", "between /16 and /24"),
    ("prod", "network.vpc_cidr", "10.0.0.1/16", "host bits set"),
    ("prod", "network.nat", "none", "'single' or 'per_az'"),
    ("prod", "node_groups[0].name", "H100!", "should match pattern"),
    ("prod", "node_groups[0].instance_type", "", "at least 1 character"),
    ("prod", "node_groups[0].accelerator", "tpu", "'gpu' or 'cpu'"),
    ("prod", "node_groups[0].gpus_per_node", 0, "greater than or equal to 1"),
    ("prod", "node_groups[0].gpu_memory_gb", 0, "greater than 0"),
    ("prod", "node_groups[0].nvlink_domain_gpus", 0, "greater than or equal to 1"),
    ("prod", "node_groups[0].min_size", -1, "greater than or equal to 0"),
    ("prod", "node_groups[0].max_size", 0, "greater than or equal to 1"),
    ("prod", "node_groups[0].price_per_hour", -1, "greater than or equal to 0"),
    ("prod", "node_groups[0].root_volume_gb", 10, "greater than or equal to 20"),
    ("prod", "node_groups[0].cache_volume_gb", 0, "greater than or equal to 1"),
    ("prod", "node_groups[0].target_queue_depth", 0, "greater than 0"),
    ("local", "local.autoscaler.scale_in_after_s", -5, "greater than or equal to 0"),
    ("prod", "node_groups[0].scale_in_utilisation", 0, "greater than 0"),
    (
        "prod",
        "node_groups[0].ami_id",
        "ubuntu-22.04",
        "should match pattern '^(ami-([0-9a-f]{8}|[0-9a-f]{17}))?$'",
    ),
    ("prod", "node_groups[0].ami_id", "ami-0123", "should match pattern"),
    ("prod", "node_groups[0].model_cache", "tmpfs", "'instance_store' or 'ebs'"),
    ("prod", "model.name", "", "at least 1 character"),
    ("prod", "model.weights_uri", "https://example.com/weights", "must be an s3://bucket/prefix URI"),
    ("prod", "model.version", "", "required: the weights version"),
    ("prod", "model.num_layers", 0, "greater than or equal to 1"),
    ("prod", "model.hidden_size", 8, "greater than or equal to 16"),
    ("prod", "model.intermediate_size", 8, "greater than or equal to 16"),
    ("prod", "model.num_attention_heads", 0, "greater than or equal to 1"),
    ("prod", "model.num_kv_heads", 0, "greater than or equal to 1"),
    ("prod", "model.vocab_size", 8, "greater than or equal to 16"),
    ("prod", "model.dtype", "int4", "'float32', 'bfloat16' or 'float16'"),
    ("prod", "model.max_seq_len", 8, "greater than or equal to 16"),
    ("prod", "model.num_experts", -1, "greater than or equal to 0"),
    ("prod", "runtime.port", 80, "greater than or equal to 1024"),
    ("prod", "runtime.max_concurrency", 0, "greater than or equal to 1"),
    ("prod", "runtime.queue.max_length", -1, "greater than or equal to 0"),
    ("prod", "runtime.queue.timeout_ms", 0, "greater than or equal to 1"),
    ("prod", "runtime.batch.window_ms", 2000, "less than or equal to 1000"),
    ("prod", "runtime.batch.max_batch_size", 0, "greater than or equal to 1"),
    ("prod", "runtime.batch.max_num_batched_tokens", 8, "greater than or equal to 16"),
    ("prod", "runtime.kv_cache_dtype", "int8", "'fp8'"),
    ("prod", "runtime.gpu_memory_utilization", 0.99, "less than or equal to 0.98"),
    ("prod", "runtime.reserved_memory_gb", -1, "greater than or equal to 0"),
    ("prod", "runtime.tensor_parallel_size", 0, "greater than or equal to 1"),
    ("prod", "runtime.pipeline_parallel_size", 0, "greater than or equal to 1"),
    ("prod", "runtime.expert_parallel_size", 0, "greater than or equal to 1"),
    ("prod", "runtime.api_keys_secret", "", "should match pattern"),
    ("prod", "runtime.image_repository", "Frontier Runtime:latest", "should match pattern"),
    ("prod", "runtime.drain_timeout_s", -1, "greater than or equal to 0"),
    ("prod", "runtime.block_size", 0, "greater than or equal to 1"),
    ("prod", "health.readiness_path", "health", "should match pattern"),
    ("prod", "health.liveness_path", "/live ness", "should match pattern"),
    ("prod", "health.interval_s", 0, "greater than or equal to 1"),
    ("prod", "health.timeout_s", 0, "greater than or equal to 1"),
    ("prod", "health.healthy_threshold", 11, "less than or equal to 10"),
    ("prod", "health.unhealthy_threshold", 0, "greater than or equal to 1"),
    ("prod", "rollout.canary_hosts", -1, "greater than or equal to 0"),
    ("prod", "rollout.batch_size", 0, "greater than or equal to 1"),
    ("prod", "rollout.max_surge", -1, "greater than or equal to 0"),
    ("prod", "rollout.deregistration_delay_s", -1, "greater than or equal to 0"),
    ("prod", "rollout.readiness_timeout_s", 0, "greater than 0"),
    ("prod", "rollout.keep_releases", 1, "greater than or equal to 2"),
    ("prod", "rollout.gate.window_s", -1, "greater than or equal to 0"),
    ("prod", "rollout.gate.max_error_rate", 1.5, "less than or equal to 1"),
    ("prod", "rollout.gate.max_p99_latency_ms", 0, "greater than 0"),
    ("prod", "rollout.gate.min_requests", -1, "greater than or equal to 0"),
    ("prod", "slo.ttft_ms", 0, "greater than 0"),
    ("prod", "slo.tpot_ms", 0, "greater than 0"),
    ("prod", "slo.p99_latency_ms", 0, "greater than 0"),
    ("prod", "slo.error_rate", 2, "less than or equal to 1"),
    ("prod", "capacity.peak_qps", 0, "greater than 0"),
    ("prod", "capacity.safety_factor", 1.2, "greater than or equal to 1.3"),
    ("prod", "capacity.safety_factor", 1.6, "less than or equal to 1.5"),
    ("prod", "capacity.avg_prompt_tokens", 0, "greater than or equal to 1"),
    ("prod", "capacity.avg_output_tokens", 0, "greater than or equal to 1"),
    ("prod", "capacity.assumed_replica_qps", 0, "greater than 0"),
    ("prod", "inventory.source", "consul", "'static' or 'aws'"),
    ("prod", "inventory.ssh_user", "", "at least 1 character"),
    ("local", "inventory.hosts[0].name", "-host", "should match pattern"),
    ("local", "inventory.hosts[0].address", "localhost", "does not appear to be an IPv4 or IPv6 address"),
    ("local", "inventory.hosts[0].ssh_port", 0, "greater than or equal to 1"),
    ("prod", "edge.idle_timeout_s", 0, "greater than or equal to 1"),
    ("prod", "edge.waf_rate_limit", -1, "greater than or equal to 0"),
    ("prod", "drivers.driver_branch", "55", "should match pattern"),
    ("prod", "drivers.container_toolkit_version", "latest", "should match pattern"),
    ("prod", "monitoring.queue_depth_alarm", 0, "greater than or equal to 1"),
    ("local", "local.moto_port", 80, "greater than or equal to 1024"),
]


def _problem_line(message: str, field: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip().startswith(field + " ")]
    assert lines, f"no problem names {field!r} in:\n{message}"
    return lines[0]


SHIPPED_STACKS = [
    "dev",
    "eks-gateway",
    "eks-multinode",
    "eks-prod",
    "local",
    "moe-prod",
    "prod",
    "prod-multinode",
    "staging",
]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_shipped_stack_loads(stack):
    assert load_stack(stack).stack == stack


def test_the_shipped_stacks_are_these():
    assert available_stacks() == SHIPPED_STACKS


@pytest.mark.parametrize(
    ("stack", "field", "value", "allowed"), FIELD_RULES, ids=[f"{f}={v!r}" for _, f, v, _ in FIELD_RULES]
)
def test_field_out_of_range_is_refused_naming_field_value_and_range(
    changed_stack, stack, field, value, allowed
):
    path = changed_stack(stack, {field: value})
    with pytest.raises(StackError) as err:
        load_stack(stack, path=path)
    message = str(err.value)
    assert message.startswith(str(path))
    line = _problem_line(message, field)
    assert f"{field} = {value!r}" in line
    assert allowed in line


def test_unknown_key_is_refused(changed_stack):
    path = changed_stack("prod", {"runtime.max_batch": 64})
    with pytest.raises(StackError, match=r"runtime\.max_batch = 64: Extra inputs are not permitted"):
        load_stack("prod", path=path)


def test_missing_section_is_refused(changed_stack):
    path = changed_stack("prod", {}, delete=("health",))
    with pytest.raises(StackError, match=r"health: Field required"):
        load_stack("prod", path=path)


def test_missing_region_is_refused(changed_stack):
    path = changed_stack("prod", {}, delete=("region",))
    with pytest.raises(StackError, match=r"aws:region: missing"):
        load_stack("prod", path=path)


def test_missing_stack_file_names_the_known_stacks():
    with pytest.raises(
        StackError,
        match=r"no such stack file.*known stacks: dev, eks-gateway, eks-multinode, eks-prod, local, moe-prod, prod, prod-multinode, staging",
    ):
        load_stack("qa")


def test_file_that_is_not_yaml_is_refused(tmp_path):
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text("config: [unclosed\n")
    with pytest.raises(StackError, match="not valid YAML"):
        load_stack("prod", path=path)


def test_file_without_config_mapping_is_refused(tmp_path):
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text("encryptionsalt: abc\n")
    with pytest.raises(StackError, match="expected a top-level 'config:' mapping"):
        load_stack("prod", path=path)


def test_all_problems_are_reported_at_once(changed_stack):
    path = changed_stack("prod", {"runtime.port": 80, "slo.error_rate": 2})
    with pytest.raises(StackError) as err:
        load_stack("prod", path=path)
    assert "2 problem(s)" in str(err.value)


# --- cross checks: rules that span fields -----------------------------------------------------------

# rule: (stack, changes, "field = value" named, words of the rule)
CROSS_RULES = {
    "max_batch_size above max_concurrency": (
        "local",
        {"runtime.batch.max_batch_size": 32},
        "runtime.batch.max_batch_size = 32",
        "must be <= runtime.max_concurrency (16)",
    ),
    "max_concurrency above queue capacity": (
        "prod",
        {"runtime.max_concurrency": 600},
        "runtime.max_concurrency = 600",
        "must be <= runtime.queue.max_length (512)",
    ),
    "token budget below one decode token per sequence": (
        "prod",
        {"runtime.batch.max_num_batched_tokens": 64},
        "runtime.batch.max_num_batched_tokens = 64",
        "must be >= runtime.batch.max_batch_size (128)",
    ),
    "whole prompt fits one step without chunked prefill": (
        "local",
        {"runtime.batch.chunked_prefill": False, "runtime.batch.max_num_batched_tokens": 512},
        "runtime.batch.max_num_batched_tokens = 512",
        "must be >= model.max_seq_len (1024) when chunked_prefill is off",
    ),
    "hidden size divisible by heads": (
        "local",
        {"model.hidden_size": 260},
        "model.hidden_size = 260",
        "must be divisible by model.num_attention_heads (8)",
    ),
    "kv heads divide heads": (
        "local",
        {"model.num_kv_heads": 3},
        "model.num_kv_heads = 3",
        "must divide model.num_attention_heads (8)",
    ),
    "tensor parallel divides heads": (
        "prod",
        {"runtime.tensor_parallel_size": 6},
        "runtime.tensor_parallel_size = 6",
        "must divide model.num_attention_heads (64)",
    ),
    "tensor parallel splits or replicates kv heads evenly": (
        "staging",
        {
            "model.hidden_size": 3072,
            "model.num_attention_heads": 24,
            "model.num_kv_heads": 6,
            "runtime.tensor_parallel_size": 4,
        },
        "runtime.tensor_parallel_size = 4",
        "must divide model.num_kv_heads (6) or be a multiple of it",
    ),
    "pipeline parallel divides layers": (
        "prod",
        {"runtime.tensor_parallel_size": 2, "runtime.pipeline_parallel_size": 3},
        "runtime.pipeline_parallel_size = 3",
        "must divide model.num_layers (80)",
    ),
    "expert parallel needs experts": (
        "prod",
        {"runtime.expert_parallel_size": 2},
        "runtime.expert_parallel_size = 2",
        "must be 1 for a dense model",
    ),
    "expert parallel divides experts": (
        "prod",
        {"model.num_experts": 6, "runtime.expert_parallel_size": 4, "model.intermediate_size": 2048},
        "runtime.expert_parallel_size = 4",
        "must divide model.num_experts (6)",
    ),
    "a replica on one node fits the GPUs of a node": (
        "prod",
        {"runtime.pipeline_parallel_size": 2},
        "runtime.nodes_per_replica = 1",
        "pipeline (2) x max(tensor (8), expert (1)) parallel = 16 GPUs over 1 node(s) is 16 per node, more "
        "than the 8 GPUs per node of node group 'h100'; set runtime.nodes_per_replica to 2 or more",
    ),
    "a replica over nodes fits each node its share": (
        "prod",
        {"runtime.pipeline_parallel_size": 4, "runtime.nodes_per_replica": 2},
        "runtime.nodes_per_replica = 2",
        "= 32 GPUs over 2 node(s) is 16 per node, more than the 8 GPUs per node",
    ),
    "nodes split a replica's ranks evenly": (
        "prod",
        {"runtime.pipeline_parallel_size": 2, "runtime.nodes_per_replica": 3},
        "runtime.nodes_per_replica = 3",
        "must divide the replica's 16 ranks (pipeline 2 x max(tensor 8, expert 1))",
    ),
    "a pipeline stage spans nodes only inside one NVLink domain": (
        "prod",
        {"runtime.nodes_per_replica": 2},
        "runtime.nodes_per_replica = 2",
        "a pipeline stage's 8 GPUs would lie on 2 nodes, but one NVLink domain joins 1 (nvlink_domain_gpus = 8",
    ),
    "expert parallel stays inside one NVLink domain": (
        "prod",
        {"model.num_experts": 16, "runtime.expert_parallel_size": 16, "model.intermediate_size": 2048},
        "runtime.expert_parallel_size = 16",
        "must stay inside one NVLink domain: node group 'h100' has nvlink_domain_gpus = 8",
    ),
    "desired size within min and max": (
        "prod",
        {"node_groups[0].desired_size": 11},
        "node_groups[0].desired_size = 11",
        "must lie within min_size (4) .. max_size (10)",
    ),
    "min size not above max size": (
        "prod",
        {"node_groups[0].min_size": 11},
        "node_groups[0].min_size = 11",
        "must be <= max_size (10); the group scales between them",
    ),
    "an EC2 stack pins its AMI": (
        "prod",
        {"node_groups[0].ami_id": ""},
        "node_groups[0].ami_id = ''",
        "an EC2 stack pins its AMI (ami- followed by 8 or 17 hex digits); `fab ami.latest -s prod` proposes",
    ),
    "instance-store cache needs a type that has one": (
        "prod",
        {"node_groups[0].instance_type": "p5.4xlarge", "node_groups[0].model_cache": "instance_store"},
        "node_groups[0].model_cache = 'instance_store'",
        "p5.4xlarge has no NVMe instance store; use 'ebs', or one of: g5.12xlarge",
    ),
    "a local group grows only into listed slots": (
        "local",
        {"node_groups[0].max_size": 5},
        "node_groups[0].max_size = 5",
        "must be <= the 4 host slot(s) of inventory.hosts",
    ),
    "canary leaves a host serving": (
        "local",
        {"rollout.canary_hosts": 3},
        "rollout.canary_hosts = 3",
        "must be < node_groups[0].desired_size (3) so that a host keeps serving",
    ),
    "rollout batch leaves a host serving": (
        "staging",
        {"rollout.batch_size": 2},
        "rollout.batch_size = 2",
        "must be < node_groups[0].desired_size (2) so that a host keeps serving",
    ),
    "deregistration delay close to the drain timeout": (
        "prod",
        {"rollout.deregistration_delay_s": 700},
        "rollout.deregistration_delay_s = 700",
        "is far beyond runtime.drain_timeout_s (60.0)",
    ),
    "health check timeout below its interval": (
        "prod",
        {"health.timeout_s": 10},
        "health.timeout_s = 10",
        "must be < health.interval_s (10)",
    ),
    "readiness and liveness paths differ": (
        "prod",
        {"health.readiness_path": "/health/live"},
        "health.readiness_path = '/health/live'",
        "must differ from health.liveness_path",
    ),
    "static inventory has hosts": (
        "local",
        {"inventory.hosts": []},
        "inventory.hosts = []",
        "a static inventory needs at least one host",
    ),
    "host names are unique": (
        "local",
        {"inventory.hosts[1].name": "host-1"},
        "inventory.hosts[1].name = 'host-1'",
        "must be unique among inventory.hosts",
    ),
    "host slots are distinct": (
        "local",
        {
            "inventory.hosts[1].address": "127.0.0.2",
            "inventory.hosts[1].root": ".frontier/local/hosts/host-1",
        },
        "inventory.hosts[1].root = '.frontier/local/hosts/host-1'",
        "another host already uses 127.0.0.2:2222 with this root",
    ),
    "local ports are distinct": (
        "local",
        {"local.balancer_port": 5055},
        "local.balancer_port = 5055",
        "must differ from local.moto_port",
    ),
    "cloud stacks serve HTTPS with an ACM certificate": (
        "prod",
        {"edge.certificate_arn": ""},
        "edge.certificate_arn = ''",
        "must be an ACM certificate ARN",
    ),
    "a GPU attention backend required on CPU hosts": (
        "local",
        {"runtime.attention_backend": "triton"},
        "runtime.attention_backend = 'triton'",
        "needs a GPU, and node group 'cpu' serves on CPU",
    ),
    "the CPU kernel required on GPU hosts": (
        "prod",
        {"runtime.attention_backend": "cpu-kernel"},
        "runtime.attention_backend = 'cpu-kernel'",
        "runs on CPU hosts only",
    ),
    "FlashAttention required with an fp8 KV cache": (
        "prod",
        {"runtime.attention_backend": "flash-varlen", "runtime.kv_cache_dtype": "fp8"},
        "runtime.attention_backend = 'flash-varlen'",
        "reads no fp8 KV cache",
    ),
    "the runtime's queue outwaits the balancer": (
        "prod",
        {"runtime.queue.timeout_ms": 400_000},
        "runtime.queue.timeout_ms = 400000",
        "must give up before edge.idle_timeout_s (300 s)",
    ),
    "the gateway outwaits the ALB in front of it": (
        "prod",
        {
            "gateway": {
                "metering": {"uri": "s3://metering/prod"},
                "ami_id": "ami-0123456789abcdef0",
                "request_timeout_s": 400,
            }
        },
        "gateway.request_timeout_s = 400.0",
        "(runtime.queue.timeout_ms = 10 s, gateway.request_timeout_s = 400 s, edge.idle_timeout_s = 300 s)",
    ),
    "p99 latency SLO not below the TTFT SLO": (
        "prod",
        {"slo.p99_latency_ms": 1000},
        "slo.p99_latency_ms = 1000.0",
        "must be >= slo.ttft_ms (1500.0)",
    ),
}


@pytest.mark.parametrize(("stack", "changes", "named", "rule"), CROSS_RULES.values(), ids=CROSS_RULES.keys())
def test_cross_check_is_refused_naming_field_value_and_rule(changed_stack, stack, changes, named, rule):
    path = changed_stack(stack, changes)
    with pytest.raises(StackError) as err:
        load_stack(stack, path=path)
    field = named.split(" = ")[0]
    line = _problem_line(str(err.value), field)
    assert named in line
    assert rule in line


def test_node_group_names_are_unique(stacks_copy, changed_stack):
    group = load_stack("prod").serving_group.model_dump()
    path = changed_stack("prod", {"node_groups": [group, group]})
    with pytest.raises(StackError) as err:
        load_stack("prod", path=path)
    assert "node_groups[1].name = 'h100': must be unique among node_groups" in str(err.value)


def test_model_that_does_not_fit_gpu_memory_names_each_number(changed_stack):
    path = changed_stack("prod", {"node_groups[0].gpu_memory_gb": 40})
    with pytest.raises(StackError) as err:
        load_stack("prod", path=path)
    line = _problem_line(str(err.value), "node_groups[0].gpu_memory_gb")
    assert line.startswith("node_groups[0].gpu_memory_gb = 40.0: the model does not fit:")
    for number in (
        "weights/GPU 17.64 GB",
        "KV cache 42.95 GB",
        "1048576 tokens x 40960 B/token/GPU",
        "reserved 4.00 GB",
        "= 64.59 GB > budget 36.00 GB",
        "gpu_memory_utilization 0.9 x 40 GB",
    ):
        assert number in line


def test_fp8_kv_cache_halves_kv_memory_so_the_model_fits_a_smaller_gpu(changed_stack):
    path = changed_stack("prod", {"node_groups[0].gpu_memory_gb": 48})
    with pytest.raises(StackError, match="the model does not fit"):
        load_stack("prod", path=path)
    path = changed_stack("prod", {"runtime.kv_cache_dtype": "fp8"})
    assert load_stack("prod", path=path).runtime.kv_cache_dtype == "fp8"


# --- through the command line ---------------------------------------------------------------------


def _fab(*args: str, stacks_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FRONTIER_STACKS_DIR": str(stacks_dir), "FRONTIER_STACK": ""}
    return subprocess.run(
        [FAB, *args], cwd=project.root(), env=env, capture_output=True, text=True, timeout=60
    )


def test_fab_plan_on_a_bad_value_exits_non_zero_naming_the_field(stacks_copy, changed_stack):
    changed_stack("prod", {"runtime.gpu_memory_utilization": 1.5})
    result = _fab("plan", "-s", "prod", stacks_dir=stacks_copy)
    assert result.returncode != 0
    assert "runtime.gpu_memory_utilization = 1.5: Input should be less than or equal to 0.98" in result.stderr
    assert "Traceback" not in result.stderr


def test_fab_plan_on_a_broken_cross_check_exits_non_zero_naming_the_field(stacks_copy, changed_stack):
    changed_stack("prod", {"runtime.pipeline_parallel_size": 2})
    result = _fab("plan", "--stack", "prod", stacks_dir=stacks_copy)
    assert result.returncode != 0
    assert (
        "runtime.nodes_per_replica = 1: pipeline (2) x max(tensor (8), expert (1)) parallel = 16 GPUs"
        in result.stderr
    )
