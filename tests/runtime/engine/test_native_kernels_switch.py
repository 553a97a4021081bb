"""The switch that turns off the native CPU kernels: the engine then runs torch ops only, as a GPU host does."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_fixtures import MAX_NEW, Reference, needs_native_kernels
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.models.llama.layers import Linear
from frontier_runtime.ops import cpu_kernel, panel_gemm
from frontier_runtime.requests import SamplingParams


@pytest.fixture(autouse=True)
def _switch_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting is process-wide: later tests get it back as it was."""
    monkeypatch.setitem(cpu_kernel._setting, "native_kernels", cpu_kernel._setting["native_kernels"])
    monkeypatch.delenv(cpu_kernel.ENV_SWITCH, raising=False)


def test_with_native_kernels_off_greedy_outputs_equal_transformers_and_no_kernel_is_loaded(
    gqa_ref: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_kernel, "_state", {})  # as in a fresh process: nothing built or loaded yet
    engine = LLMEngine(gqa_ref.model_dir, native_kernels=False)
    outputs = engine.generate(gqa_ref.prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
    assert outputs == gqa_ref.outputs
    assert engine.runner.backend.name == "sdpa-gather"
    assert not any(m.panels for m in engine.runner.model.modules() if isinstance(m, Linear))
    assert not cpu_kernel.loaded() and cpu_kernel._state == {}


def test_the_environment_variable_overrides_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_kernel.use_native_kernels(True)
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "0")
    assert not cpu_kernel.enabled() and not cpu_kernel.load()
    cpu_kernel.use_native_kernels(False)
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "1")
    assert cpu_kernel.enabled()


def test_without_the_environment_variable_the_setting_decides() -> None:
    cpu_kernel.use_native_kernels(False)
    assert not cpu_kernel.enabled()
    cpu_kernel.use_native_kernels(True)
    assert cpu_kernel.enabled()


def test_an_unreadable_switch_value_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "maybe")
    with pytest.raises(ValueError, match="FRONTIER_NATIVE_KERNELS='maybe'"):
        cpu_kernel.enabled()


def test_an_engine_on_torch_ops_reports_them_and_its_attention_backend(tied_dir: Path) -> None:
    stats = LLMEngine(tied_dir, native_kernels=False, max_seq_len=64, num_blocks=8).stats()
    assert (stats.attention_backend, stats.kernels) == ("sdpa-gather", "torch")


@needs_native_kernels
def test_an_engine_on_the_native_kernels_reports_them_and_its_attention_backend(tied_dir: Path) -> None:
    stats = LLMEngine(tied_dir, max_seq_len=64, num_blocks=8).stats()
    assert stats.attention_backend == "cpu-kernel"
    native = f"native-{cpu_kernel.variant()}"  # the prebuilt variant this CPU got
    assert stats.kernels == (f"{native}+panel-gemm" if panel_gemm.available() else native)
