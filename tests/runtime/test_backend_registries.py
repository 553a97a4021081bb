"""Attention backends and weight quantizations are registered classes, each name spelled once.

The settings' ``Literal`` types, the registries of classes and the torch-free table that the stack
check reads name the same backends and methods; nothing outside the registries branches on a name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
import torch
from frontier_runtime.config import AttentionBackend, Dtype, KvCacheDtype, Quantization
from frontier_runtime.models.llama import quant
from frontier_runtime.ops import attention, table

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "frontier_runtime"
# Where the names live: the table, the attention backends' package, the quantization methods' module.
REGISTRIES = (
    RUNTIME / "ops" / "table.py",
    RUNTIME / "ops" / "attention",
    RUNTIME / "models" / "llama" / "quant.py",
)


def test_every_attention_backend_setting_has_a_registered_class_and_every_class_a_setting() -> None:
    settings = set(get_args(AttentionBackend)) - {table.AUTO}
    assert settings == set(attention.BACKENDS) == set(table.ATTENTION_BACKENDS)
    assert table.AUTO in get_args(AttentionBackend)


def test_every_quantization_setting_has_a_registered_class_and_every_class_a_setting() -> None:
    assert set(get_args(Quantization)) == set(quant.METHODS) == set(table.QUANTIZATIONS)


def test_each_class_takes_its_facts_from_its_table_entry() -> None:
    for name, cls in attention.BACKENDS.items():
        assert cls.name == name and cls.traits is table.ATTENTION_BACKENDS[name]
    for name, method in quant.METHODS.items():
        assert method.name == name and method.traits is table.QUANTIZATIONS[name]
        stored = "" if method.weight_dtype is None else str(method.weight_dtype).removeprefix("torch.")
        assert stored == method.traits.weights


def test_the_table_speaks_the_settings_vocabulary() -> None:
    for traits in table.ATTENTION_BACKENDS.values():
        assert set(traits.dtypes) <= set(get_args(Dtype))
        assert set(traits.kv_dtypes) <= set(get_args(KvCacheDtype)) - {table.AUTO}
        assert set(traits.devices) <= set(table.DEVICES)
    for q in table.QUANTIZATIONS.values():
        assert set(q.devices) <= set(table.DEVICES)


@pytest.mark.parametrize("name", list(attention.BACKENDS))
def test_a_backends_kv_cache_is_laid_out_as_its_traits_say(name: str) -> None:
    cls = attention.backend(name)
    sizes = {"blocks": 3, "block_size": 4, "kv_heads": 5, "head_dim": 6}
    k, v = cls.allocate_kv(3, 4, 5, 6, torch.float32)
    assert k.shape == tuple(sizes[a] for a in cls.traits.k_layout)
    assert v.shape == tuple(sizes[a] for a in cls.traits.v_layout)
    assert not k.any() and not v.any()


def test_auto_tries_each_devices_backends_fastest_first_and_ends_on_the_portable_one() -> None:
    assert table.attention_backends_on(table.CPU) == ("cpu-kernel", "sdpa-gather")
    assert table.attention_backends_on(table.CUDA) == ("flash-varlen", "triton", "sdpa-gather")
    assert table.attention_backends_on(table.CUDA, "fp8") == ("triton", "sdpa-gather")
    assert attention.PORTABLE.traits.devices == table.DEVICES


def test_only_backends_that_read_tensors_alone_are_captured_in_graphs() -> None:
    captured = {name for name, t in table.ATTENTION_BACKENDS.items() if t.graph_capturable}
    assert captured == {"cpu-kernel", "flash-varlen", "triton"}  # sdpa-gather pads from host lengths


def test_fp8_weights_need_a_gpu_and_int8_runs_anywhere() -> None:
    assert table.quantizations_on(table.CPU) == ("none", "int8")
    assert table.quantizations_on(table.CUDA) == ("none", "int8", "fp8")
    assert quant.device_problem("fp8", "cpu") == (
        "model.quantization 'fp8' needs a CUDA GPU (float8_e4m3fn weights), and this runtime's device is "
        "'cpu', which runs model.quantization 'none' or 'int8'"
    )
    with pytest.raises(quant.QuantizationError, match="'fp4' is not one of"):
        quant.method("fp4")


def test_the_table_and_the_stack_check_that_reads_it_load_without_torch() -> None:
    code = "import sys, frontier_runtime.ops.table, frontier.config.checks; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


# ---- no branch on a name outside the registries ----------------------------------------------------

BACKEND_NAMES = frozenset(table.ATTENTION_BACKENDS)
QUANTIZATION_NAMES = frozenset(table.QUANTIZATIONS)

# Comparisons in the toolkit's capacity planner and memory fit, which the settings refactor is
# rewriting as this lands; each is to read ``frontier_runtime.ops.table`` instead. The list only
# shrinks: a comparison not on it fails the test below.
KNOWN_ELSEWHERE = {
    ("frontier/config/memory.py", "model.quantization == 'none'"),
    ("frontier/capacity/quality.py", "self.quantization == 'none'"),
    ("frontier/capacity/quality.py", "variant.quantization == 'fp8'"),
    ("frontier/capacity/explore.py", "self.quantization != 'none'"),
}


def _strings(node: ast.expr) -> set[str]:
    """The string constants ``node`` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for elt in node.elts for s in _strings(elt)}
    return set()


def name_comparisons(path: Path) -> list[str]:
    """Comparisons in ``path`` of a value against a backend's name, or of a quantization setting
    (an operand spelled with "quantization") against a method's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = set().union(*(_strings(op) for op in operands))
        spelled = " ".join(ast.unparse(op) for op in operands if not _strings(op))
        if names & BACKEND_NAMES or (names & QUANTIZATION_NAMES and "quantization" in spelled):
            found.append(ast.unparse(node).replace('"', "'"))
    return found


def _outside_registries() -> list[Path]:
    files = [*RUNTIME.rglob("*.py"), *(ROOT / "frontier").rglob("*.py")]
    return [
        p
        for p in files
        if not any(p == r or r in p.parents for r in REGISTRIES) and "__pycache__" not in p.parts
    ]


def test_no_module_outside_the_registries_compares_a_backend_or_quantization_name() -> None:
    found = {
        (str(path.relative_to(ROOT)), comparison)
        for path in _outside_registries()
        for comparison in name_comparisons(path)
    }
    assert found - KNOWN_ELSEWHERE == set(), "branch on the class (or ops.table), not on its name"


def test_the_scan_sees_both_kinds_of_name_comparison(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "if backend in ('triton', 'flash-varlen'): pass\n"
        "if cfg.quantization == 'int8': pass\n"
        "if kv_cache_dtype == 'fp8': pass\n"  # a KV cache dtype, not a weight quantization
    )
    assert name_comparisons(module) == ["backend in ('triton', 'flash-varlen')", "cfg.quantization == 'int8'"]
