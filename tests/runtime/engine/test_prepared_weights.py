"""The prepared weights: a model saved as loaded (packed panels, fused projections, flags) and mapped
back gives the same tensors and the same greedy tokens, and a file made for another engine is refused."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
import torch
from engine_fixtures import Reference, needs_native_kernels
from frontier_runtime.distributed import Placement
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.models.llama import prepared
from frontier_runtime.models.llama.layers import Linear
from frontier_runtime.models.llama.loader import load_model
from frontier_runtime.requests import SamplingParams

# The prepared file holds the native kernels' panels; on torch ops alone a CPU load packs weights in
# oneDNN's opaque layout, which is refused (the last test) rather than written.
pytestmark = needs_native_kernels

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
CPU = torch.device("cpu")


def _prepared_dir(model_dir: Path, target: Path, spec: prepared.PreparedSpec | None = None) -> Path:
    """``model_dir``'s small files and the prepared file of its float32 load on this CPU."""
    target.mkdir()
    for file in model_dir.iterdir():
        if file.is_file() and not file.name.endswith(".safetensors"):
            shutil.copyfile(file, target / file.name)
    model = load_model(model_dir)
    spec = spec or prepared.spec_for(CPU, torch.float32, "none", Placement())
    prepared.save_prepared(model, target, spec)
    return target


def test_a_restored_model_holds_the_loaded_tensors_in_the_same_layouts(gqa_dir: Path, tmp_path: Path) -> None:
    loaded = load_model(gqa_dir)
    restored = load_model(_prepared_dir(gqa_dir, tmp_path / "prepared"))
    pairs = list(zip(loaded.named_modules(), restored.named_modules(), strict=True))
    linears = 0
    for (name, a), (_, b) in pairs:
        for (pa, ta), (pb, tb) in zip(
            a.named_parameters(recurse=False), b.named_parameters(recurse=False), strict=True
        ):
            assert pa == pb and torch.equal(ta, tb), f"{name}.{pa}"
        if isinstance(a, Linear):
            linears += 1
            assert isinstance(b, Linear)
            for attr in ("packed", "weight_t", "qweight"):
                ta, tb = getattr(a, attr), getattr(b, attr)
                assert (ta is None and tb is None) or torch.equal(ta, tb), f"{name}.{attr}"
            for flag in ("panels", "bf16_panels", "float_out", "widen", "qpanels"):
                assert getattr(a, flag) == getattr(b, flag), f"{name}.{flag}"
    assert linears > 0


def test_an_engine_loaded_through_the_prepared_file_generates_the_same_greedy_tokens(
    gqa_ref: Reference, tmp_path: Path
) -> None:
    prepared_dir = _prepared_dir(gqa_ref.model_dir, tmp_path / "prepared")
    assert not list(prepared_dir.glob("model*.safetensors"))  # the checkpoint is not there to fall back on
    from_checkpoint = LLMEngine(gqa_ref.model_dir, max_batch_size=4).generate(gqa_ref.prompts, GREEDY)
    from_prepared = LLMEngine(prepared_dir, max_batch_size=4).generate(gqa_ref.prompts, GREEDY)
    assert from_prepared == from_checkpoint == gqa_ref.outputs


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("device", "cpu:x86_64:avx2:plain"),
        ("runtime", "0.0.1+torch0+0000000000000000"),
        ("dtype", "torch.bfloat16"),
        ("placement", "rank1:tp1/2:ep1:pp1"),
    ],
)
def test_a_file_prepared_for_another_engine_is_refused_naming_the_field(
    gqa_dir: Path, tmp_path: Path, field: str, value: str
) -> None:
    ours = prepared.spec_for(CPU, torch.float32, "none", Placement())
    other = dataclasses.replace(ours, **{field: value})
    prepared_dir = _prepared_dir(gqa_dir, tmp_path / "prepared", other)
    with pytest.raises(prepared.PreparedMismatch, match=re.escape(f"{field}: '{value}'")):
        load_model(prepared_dir)


def test_the_device_kind_names_the_kernel_choices_the_layout_depends_on() -> None:
    kind = prepared.device_kind(CPU)
    assert kind.startswith("cpu:")
    machine, variant, gemms = kind.split(":")[1:]
    assert machine and variant and gemms


def test_weights_in_onednns_opaque_layout_are_refused_naming_the_tensor(
    gqa_dir: Path, tmp_path: Path
) -> None:
    model = load_model(gqa_dir)
    linear = next(m for m in model.modules() if isinstance(m, Linear))
    linear.register_buffer("onednn", torch.randn(8, 8).to_mkldnn())
    spec = prepared.spec_for(CPU, torch.float32, "none", Placement())
    with pytest.raises(prepared.PreparedUnsupported, match=r"onednn is held in oneDNN's opaque layout"):
        prepared.save_prepared(model, tmp_path / "prepared", spec)
    assert not (tmp_path / "prepared" / prepared.PREPARED_NAME).exists()
