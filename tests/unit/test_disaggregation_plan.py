"""`fab plan --explore`: colocated or prefill/decode replicas for the pool's prompt and output
lengths, the KV transfer's cost over the interconnect, and the reason for the pick."""

from __future__ import annotations

import json

import pytest

from frontier import project
from frontier.capacity import disaggregation
from frontier.capacity.disaggregation import choose, transfer_rate
from frontier.capacity.explore import explore
from frontier.capacity.gpus import INSTANCES, NETWORK_GBPS
from frontier.capacity.plan_tables import Table, disaggregation_report
from frontier.capacity.replica import model_stack
from frontier.capacity.roofline import GPU_EFFICIENCY
from frontier.targets import load_stack, stack_problems

WITHOUT_FP8 = ("auto", "bfloat16", "float16", "float32")
# An 8B Llama (32 layers, 8 KV heads of 128): big enough that a long prompt's prefill stalls a
# step for hundreds of milliseconds, small enough for one GPU (the transfer moves one rank's cache).
LLAMA_8B = {
    "model.num_layers": 32,
    "model.hidden_size": 4096,
    "model.intermediate_size": 14336,
    "model.num_attention_heads": 32,
    "model.num_kv_heads": 8,
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch, stacks_copy):
    monkeypatch.chdir(project.root())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))
    monkeypatch.delenv("FRONTIER_STACK", raising=False)


def chosen(changed_stack, prompt: int, output: int, changes: dict[str, object] | None = None):
    changed_stack(
        "prod",
        {**(changes or {}), "capacity.avg_prompt_tokens": prompt, "capacity.avg_output_tokens": output},
    )
    settings = load_stack("prod")
    model = model_stack(settings, settings.only_pool, None)
    return settings, choose(
        settings,
        settings.only_pool,
        model,
        explore(settings, settings.only_pool, model, WITHOUT_FP8, rules=stack_problems),
    )


def test_short_prompts_are_served_colocated(changed_stack):
    _, choice = chosen(changed_stack, 200, 300, LLAMA_8B)
    assert choice.picked.kind == "colocated"
    assert any(x.kind == "P/D" and x.passes for x in choice.layouts)  # offered, and dearer
    picked = choice.picked
    assert choice.reason.startswith("colocated: prefill interference raises decode ITL p99 by ")
    assert (
        f"within slo.tpot_ms 80) at 200 input tokens on colocated {picked.candidate.label};" in choice.reason
    )
    assert "colocated is cheaper" in choice.reason


def test_long_prompts_on_a_big_model_are_split_into_prefill_and_decode(changed_stack):
    _, choice = chosen(changed_stack, 7000, 500, LLAMA_8B)
    picked = choice.picked
    assert picked.kind == "P/D" and picked.passes
    assert picked.candidate.tensor_parallel == 1
    same = [
        x
        for x in choice.layouts
        if x.kind == "colocated" and x.candidate.instance_type == picked.candidate.instance_type
    ]
    # Colocated on the same GPUs, a 7,000-token prompt's chunk stalls every stream past slo.tpot_ms.
    assert same and not same[0].passes and any("ITL p99" in b for b in same[0].broken)
    assert picked.itl.p99_s < same[0].itl.p99_s


def test_the_reason_names_the_interference_and_the_transfer_in_figures(changed_stack):
    _, choice = chosen(changed_stack, 7000, 500, LLAMA_8B)
    picked = choice.picked
    same = next(
        x
        for x in choice.layouts
        if x.kind == "colocated" and x.candidate.instance_type == picked.candidate.instance_type
    )
    raised = (same.itl.p99_s - same.itl.plain_s) * 1e3
    assert choice.reason.startswith(
        f"P/D: prefill interference raises decode ITL p99 by {raised:,.1f} ms ({same.itl.plain_s * 1e3:,.1f} ms -> "
        f"{same.itl.p99_s * 1e3:,.1f} ms, over slo.tpot_ms 80) at 7,000 input tokens on colocated "
        f"{same.candidate.label};"
    )
    assert f"the KV transfer costs {picked.transfer_s * 1e3:,.1f} ms a prompt" in choice.reason
    assert f"P/D on {picked.candidate.label} ${picked.cost_per_million:.3g} vs colocated on " in choice.reason


def test_the_picked_split_prints_as_the_pools_disaggregation_setting(changed_stack):
    settings, choice = chosen(changed_stack, 7000, 500, LLAMA_8B)
    p = choice.picked
    assert choice.disaggregation_yaml("h100") == (
        "disaggregation:\n"
        f"  prefill: {{node_group: h100-prefill, replicas: {p.prefill_replicas}}}\n"
        f"  decode: {{node_group: h100, replicas: {p.replicas}}}"
    )
    lines = [r for r in disaggregation_report(settings.only_pool, choice) if isinstance(r, str)]
    assert f"layout: {choice.reason}" in lines
    assert any(line.endswith(choice.disaggregation_yaml(settings.serving_group.name)) for line in lines)
    table = next(r for r in disaggregation_report(settings.only_pool, choice) if isinstance(r, Table))
    assert [row[0] for row in table.rows].count("picked") == 1


def test_a_replica_of_several_ranks_is_not_split_and_the_count_says_why(changed_stack):
    _, choice = chosen(changed_stack, 1500, 350)  # prod's 70B: no single GPU holds it
    assert all(x.kind == "colocated" for x in choice.layouts)
    assert choice.picked.kind == "colocated"
    (why, n), *_ = choice.not_split
    assert why.startswith("P/D moves one rank's KV cache") and n > 0
    assert choice.reason.startswith(
        f"colocated on {choice.picked.candidate.label}: P/D is not offered (P/D moves"
    )


def test_on_a_cpu_host_the_transfer_cost_comes_from_the_measured_table():
    group = load_stack("local").serving_group
    rows = json.loads(disaggregation.TABLE.read_text())["measurements"]
    tiny = next(r for r in rows if r["block_bytes"] == 128 * 1024)
    rate = transfer_rate(group, 128 * 1024, GPU_EFFICIENCY)
    assert rate is not None and rate.measured
    assert (rate.bytes_per_s, rate.per_pull_s) == (tiny["bytes_per_s"], tiny["per_pull_s"])
    assert rate.seconds(8e6) == pytest.approx(tiny["per_pull_s"] + 8e6 / tiny["bytes_per_s"])
    assert "bench/kv_transfer_rate.py" in rate.over


def test_a_prompts_transfer_moves_its_full_blocks_before_the_last_token_at_the_rate(changed_stack):
    settings, choice = chosen(changed_stack, 7000, 500, LLAMA_8B)
    p = choice.picked
    assert p.rate is not None
    # 8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB a token; 437 blocks of 16 leased.
    assert p.transfer_bytes == (7000 - 1) // 16 * 16 * 131072
    assert p.transfer_s == pytest.approx(p.rate.seconds(p.transfer_bytes))
    assert p.ttft_s > p.transfer_s


def test_on_a_gpu_node_the_transfer_runs_at_the_network_figure_said_unmeasured():
    group = load_stack("prod").serving_group  # p5.48xlarge
    rate = transfer_rate(group, 2 * 1024 * 1024, GPU_EFFICIENCY)
    assert rate is not None and not rate.measured
    assert rate.bytes_per_s == INSTANCES["p5.48xlarge"].network_bandwidth
    efa = transfer_rate(group.model_copy(update={"efa": True}), 2 * 1024 * 1024, GPU_EFFICIENCY)
    assert efa is not None and efa.over.startswith("EFA of p5.48xlarge")
    assert rate.over.startswith(f"network of p5.48xlarge, {NETWORK_GBPS['p5.48xlarge']:g} Gbit/s / 8 GPUs")
    assert rate.over.endswith("(datasheet, unmeasured here)")


def test_a_split_the_stacks_rules_refuse_is_not_offered_and_the_rule_is_quoted(changed_stack):
    _, choice = chosen(changed_stack, 7000, 500, {**LLAMA_8B, "runtime.prefix_caching": False})
    assert all(x.kind == "colocated" for x in choice.layouts)
    refused = dict(choice.not_split)
    why = (
        "the split is refused by the stack's own rules: runtime.prefix_caching = False: must be true in a "
        "disaggregated pool: decode replicas enter pulled blocks by their hashes"
    )
    assert refused[why] > 0
    assert why in choice.reason
