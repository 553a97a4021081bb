"""The planner takes a weight quantization's speed from what was measured, not from its bytes, and
never recommends one measured slower than the weights it replaces."""

from __future__ import annotations

import pytest

from frontier.capacity import quantization_speed as qs
from frontier.capacity.explore import explore, measured_quantization
from frontier.capacity.quality import WEIGHTS
from frontier.capacity.replica import model_stack
from frontier.capacity.roofline import GPU_EFFICIENCY, Shape
from frontier.targets import load_stack, stack_problems


def prod_exploration():
    prod = load_stack("prod")
    return explore(
        prod,
        prod.only_pool,
        model_stack(prod, prod.only_pool, None),
        ("auto",),
        rules=stack_problems,
        quantizations=WEIGHTS,
    )


def test_the_committed_table_holds_what_the_gpu_check_measured():
    int8 = qs.speed_of("cuda", "bfloat16", "int8")
    fp8 = qs.speed_of("cuda", "bfloat16", "fp8")
    assert int8 is not None and int8.factor == pytest.approx(0.24) and int8.slower
    assert fp8 is not None and fp8.factor == pytest.approx(0.57) and fp8.slower
    assert "H200" in int8.describe()


def test_options_measured_slower_are_never_recommended():
    ex = prod_exploration()
    assert {o.candidate.quantization for o in ex.options} == {"none"}
    reasons = dict(ex.dropped)
    assert reasons["quantization: int8 weights measured slower than bfloat16 on cuda"] > 0
    assert reasons["quantization: fp8 weights measured slower than bfloat16 on cuda"] > 0


def test_a_method_never_measured_on_a_device_is_not_recommended_there():
    assert qs.why_not_recommended("cuda", "float16", "int8") == (
        "quantization: int8 weights not measured on cuda in float16 (bench/quantized_weights.py --write-table)"
    )
    assert qs.why_not_recommended("cuda", "float16", "none") == ""


def test_a_method_measured_faster_is_offered_at_its_measured_speed_not_its_bytes(monkeypatch):
    monkeypatch.setattr(
        qs, "_committed", lambda: (qs.Measured("cuda", "bfloat16", "int8", 1, 1.2, "a test's"),)
    )
    assert "int8" in {o.candidate.quantization for o in prod_exploration().options}
    prod = load_stack("prod")
    int8 = prod.with_pool(
        prod.only_pool.model_copy(update={"model": prod.model.model_copy(update={"quantization": "int8"})})
    )
    shape = Shape.from_model(int8.model)
    held = measured_quantization(GPU_EFFICIENCY, shape, "cuda", "bfloat16", "int8")
    # The weights' bytes alone promise about 2x; streaming them at this bandwidth gives the 1.2x measured.
    bytes_ratio = shape.dense_bytes / Shape.from_model(prod.model).dense_bytes
    assert held.bandwidth == pytest.approx(GPU_EFFICIENCY.bandwidth * 1.2 * bytes_ratio)
    assert "int8 weights held to their measured 1.20x" in held.source


def test_the_quality_table_says_why_a_weights_format_has_no_option():
    from frontier.capacity.explore import why_no_option

    ex = prod_exploration()
    assert why_no_option(ex, "int8") == "not offered: measured slower than bfloat16 on cuda"
    assert why_no_option(ex, "none") == "no option meets every SLO"
