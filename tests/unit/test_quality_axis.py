"""The quality axis of `fab plan --explore`: which variants are measured, on what model, and which
lie on the price-pass-rate front."""

from __future__ import annotations

import pytest

from frontier import project
from frontier.capacity.explore import explore
from frontier.capacity.quality import (
    WEIGHTS,
    QualityRun,
    Variant,
    VariantQuality,
    quality_points,
    scaled_shape,
    variants_to_measure,
    why_not_here,
)
from frontier.capacity.replica import model_stack
from frontier.targets import load_stack, stack_problems


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch, stacks_copy):
    monkeypatch.chdir(project.root())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))
    monkeypatch.delenv("FRONTIER_STACK", raising=False)


def test_the_scaled_model_keeps_head_dim_the_query_to_kv_ratio_and_the_mlp_ratio():
    prod = load_stack("prod")  # llama-3.1-70b: 64 heads of 128, 8 KV heads, MLP 28672 / 8192 = 3.5
    shape = scaled_shape(prod.only_pool)
    assert shape["num_heads"] == 8 and shape["num_kv_heads"] == 1  # 8:1 as in the model
    assert shape["hidden_size"] == 8 * 128  # head_dim 128 kept
    assert shape["intermediate_size"] == 3584  # 1024 x 3.5
    assert shape["num_layers"] == 2 and shape["dtype"] == "bfloat16"


def test_the_reference_is_the_unquantized_weights_with_the_stacks_own_kv_dtype():
    prod = load_stack("prod")
    variants = variants_to_measure(prod.only_pool, ("fp8", "bfloat16"))
    assert variants[0] == Variant("none", "bfloat16")
    assert len(variants) == len(WEIGHTS) * 2


def test_fp8_weights_are_not_measured_on_a_machine_without_fp8_tensor_cores():
    assert "CUDA" in why_not_here(Variant("fp8", "auto"))
    assert why_not_here(Variant("int8", "fp8")) == ""


def _run(rates: dict[tuple[str, str], float | None]) -> QualityRun:
    results = tuple(
        VariantQuality(Variant(q, kv), rate, not_measured="" if rate is not None else "no GPU")
        for (q, kv), rate in rates.items()
    )
    return QualityRun({}, "random", "default.yaml", results)


@pytest.mark.slow
def test_a_variant_is_on_the_front_when_no_cheaper_one_passes_as_much():
    prod = load_stack("prod")
    ex = explore(
        prod,
        prod.only_pool,
        model_stack(prod, prod.only_pool, None),
        ("auto", "bfloat16", "fp8"),
        rules=stack_problems,
        quantizations=WEIGHTS,
    )
    run = _run(
        {
            ("none", "bfloat16"): 1.0,
            ("none", "fp8"): 0.9,
            ("int8", "bfloat16"): 0.95,
            ("int8", "fp8"): 0.85,
            ("fp8", "bfloat16"): None,
            ("fp8", "fp8"): None,
        }
    )
    points = {(p.variant.quantization, p.variant.kv_cache_dtype): p for p in quality_points(ex, run)}
    measured = [p for p in points.values() if p.pass_rate is not None and p.option is not None]
    for p in measured:
        assert p.option is not None and p.pass_rate is not None
        dominated = any(
            o.option is not None
            and o.pass_rate is not None
            and o.option.cost_per_million <= p.option.cost_per_million
            and o.pass_rate > p.pass_rate
            for o in measured
        )
        assert p.on_front == (not dominated), p.variant
    # The most faithful variant is always on the front; an unmeasured one never is.
    assert points[("none", "bfloat16")].on_front
    assert not points[("fp8", "bfloat16")].on_front and points[("fp8", "bfloat16")].pass_rate is None


def test_without_a_quality_measurement_no_variant_is_on_the_front():
    prod = load_stack("prod")
    ex = explore(
        prod,
        prod.only_pool,
        model_stack(prod, prod.only_pool, None),
        ("auto", "bfloat16"),
        rules=stack_problems,
        quantizations=WEIGHTS,
    )
    points = quality_points(ex, None)
    # int8 and fp8 weights were measured slower than bf16 on a GPU: only unquantized options remain.
    assert {p.variant.quantization for p in points} == {"none"}
    assert not any(p.on_front for p in points)
