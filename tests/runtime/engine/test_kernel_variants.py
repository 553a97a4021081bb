"""The native CPU kernels come prebuilt in variants; the best one the CPU runs is loaded, never compiled."""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_fixtures import needs_native_kernels
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.ops import build_kernels, cpu_kernel

pytestmark = needs_native_kernels

X86_V3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
X86_V4 = X86_V3 + " avx512f avx512bw avx512cd avx512dq avx512vl"
BF16 = " avx512_bf16"
BF16_TOLERANCE = 2**-8  # a bf16 output's rounding, relative

# Run in a fresh process (a process loads one library: its ops register once): load the prebuilt
# kernels (from the directory in argv[1], if given; as on a CPU with the flags in argv[2], if given),
# then attend one sequence through the paged cache, run SwiGLU and, where the variant has it, the
# bf16 panel GEMM, and print the variant and the largest differences from torch's own ops.
PROBE = r"""
import json, sys
from pathlib import Path
from typing import Any
import torch
import torch.nn.functional as F
from frontier_runtime.ops import cpu_kernel, panel_gemm

if len(sys.argv) > 1 and sys.argv[1]:
    cpu_kernel.KERNEL_DIR = Path(sys.argv[1])
if len(sys.argv) > 2:
    cpu_kernel._cpu_flags = lambda: sys.argv[2]
assert cpu_kernel.load(), "no prebuilt variant of the native CPU kernels loaded"
torch.manual_seed(0)
# 13 tokens in blocks of 4 scattered over the pool; the last 5 are this step's prefill chunk.
BS, KVH, HQ, D, T, QN = 4, 2, 6, 16, 13, 5
blocks = [5, 1, 7, 3]
k, v, q = torch.randn(T, KVH, D), torch.randn(T, KVH, D), torch.randn(QN, HQ, D)
k_cache, v_cache = torch.zeros(8, KVH, D, BS), torch.zeros(8, KVH, BS, D)
for t in range(T):
    k_cache[blocks[t // BS], :, :, t % BS] = k[t]
    v_cache[blocks[t // BS], :, t % BS, :] = v[t]
out = torch.empty_like(q)
i32 = lambda values: torch.tensor(values, dtype=torch.int32)
torch.ops.frontier.paged_attention(
    out, q, k_cache, v_cache, i32([blocks]), i32([0]), i32([0, QN]), i32([T]), D**-0.5, 1.0, 1.0
)
causal = torch.arange(T).unsqueeze(0) <= torch.arange(T - QN, T).unsqueeze(1)
ref = F.scaled_dot_product_attention(
    q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=causal, scale=D**-0.5, enable_gqa=True
).transpose(0, 1)
gate_up = torch.randn(T, 2 * 40)
swiglu = torch.empty(T, 40)
torch.ops.frontier.silu_and_mul(swiglu, gate_up)
gate, up = gate_up.split(40, dim=-1)
# The bf16 GEMM: its error relative to the float64 product's magnitude (bf16 rounding is 2**-8).
bf16_gemm, bf16_error = panel_gemm.bf16_available(), None
x, w, b = torch.randn(21, 130).bfloat16(), torch.randn(70, 130).bfloat16(), torch.randn(70)
want = x.double() @ w.double().t() + b.double()
if bf16_gemm:
    got = panel_gemm.linear_bf16(x, panel_gemm.pack_bf16(w), 70, b)
    bf16_error = ((got.double() - want).abs() / want.abs().clamp_min(1.0)).max().item()
else:  # a variant without AVX512-BF16 refuses the op
    try:
        torch.ops.frontier.panel_linear_bf16(torch.empty(21, 70).bfloat16(), x, torch.empty(3, 65, 32, 2).bfloat16(), b)
    except RuntimeError as exc:
        bf16_error = str(exc)
print(json.dumps({
    "variant": cpu_kernel.variant(),
    "attention": (out - ref).abs().max().item(),
    "swiglu": (swiglu - F.silu(gate) * up).abs().max().item(),
    "bf16_gemm": bf16_gemm,
    "bf16_error": bf16_error,
}))
"""


def probe(
    env: dict[str, str], kernel_dir: Path | None = None, cpu_flags: str | None = None
) -> dict[str, Any]:
    args = [str(kernel_dir or ""), *([cpu_flags] if cpu_flags is not None else [])]
    argv = [sys.executable, "-c", PROBE, *(args if args != [""] else [])]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bare_env(home: Path) -> dict[str, str]:
    """No compiler anywhere: an empty PATH, no $CXX, and a home with no cache in it."""
    return {"PATH": "", "HOME": str(home), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


@pytest.mark.parametrize(
    ("flags", "machine", "chosen"),
    [
        (f"flags\t\t: {X86_V4}{BF16}", "x86_64", "avx512bf16"),
        (f"flags\t\t: {X86_V4}", "x86_64", "avx512"),
        (f"flags\t\t: {X86_V3}{BF16}", "x86_64", "avx2"),  # AVX512-BF16 needs the rest of AVX-512
        (f"flags\t\t: {X86_V3}", "x86_64", "avx2"),
        (f"flags\t\t: {X86_V3} avx512f", "x86_64", "avx2"),  # AVX-512 foundation alone is not enough
        ("flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx", "x86_64", "portable"),
        ("", "aarch64", "portable"),
    ],
    ids=[
        "avx512bf16",
        "avx512",
        "avx2-with-bf16-flag",
        "avx2-only",
        "avx512f-without-bw-dq-vl",
        "neither",
        "aarch64",
    ],
)
def test_the_best_variant_the_cpu_runs_is_chosen_from_its_flags(
    flags: str, machine: str, chosen: str
) -> None:
    assert cpu_kernel.supported_variants(flags, machine)[0] == chosen


def test_a_cpu_falls_back_to_the_lesser_variants_in_order() -> None:
    assert cpu_kernel.supported_variants(f"flags\t\t: {X86_V4}", "x86_64") == ["avx512", "avx2", "portable"]
    assert cpu_kernel.supported_variants(f"flags\t\t: {X86_V4}{BF16}", "x86_64") == [
        "avx512bf16",
        "avx512",
        "avx2",
        "portable",
    ]


def test_a_variant_setting_holds_the_loader_to_that_variant_or_a_lesser_one() -> None:
    on_bf16_cpu = cpu_kernel.supported_variants(f"flags\t\t: {X86_V4}{BF16}", "x86_64")
    assert cpu_kernel.capped(on_bf16_cpu, "avx512") == ["avx512", "avx2", "portable"]
    assert cpu_kernel.capped(on_bf16_cpu, None) == cpu_kernel.capped(on_bf16_cpu, "") == on_bf16_cpu
    # Never a better variant than the CPU runs: on a CPU without the flag, avx512bf16 is not picked.
    assert cpu_kernel.capped(["avx512", "avx2", "portable"], "avx512bf16") == ["avx512", "avx2", "portable"]
    with pytest.raises(ValueError, match="FRONTIER_KERNEL_VARIANT='avx9000'"):
        cpu_kernel.capped(on_bf16_cpu, "avx9000")


def test_every_variant_is_built_on_x86_and_avx512bf16_with_its_instructions() -> None:
    assert build_kernels.default_variants("x86_64") == ["avx512bf16", "avx512", "avx2", "portable"]
    assert build_kernels.default_variants("aarch64") == ["portable"]
    flags = json.loads(cpu_kernel.manifest_path("avx512bf16").read_text())["flags"]
    assert "-mavx512bf16" in flags and "-march=x86-64-v4" in flags
    assert cpu_kernel.library_path("avx512bf16").is_file()


def test_without_a_compiler_the_prebuilt_kernels_load_and_attend_as_torch_does(tmp_path: Path) -> None:
    result = probe(bare_env(tmp_path))
    assert result["variant"] == cpu_kernel.supported_variants(cpu_kernel._cpu_flags(), platform.machine())[0]
    assert result["attention"] < 1e-5 and result["swiglu"] < 1e-5
    assert list(tmp_path.iterdir()) == []  # no kernel cache written


@pytest.mark.parametrize(
    "variant", cpu_kernel.supported_variants(cpu_kernel._cpu_flags(), platform.machine())
)
def test_every_prebuilt_variant_this_cpu_runs_gives_the_numbers_torch_gives(
    variant: str, tmp_path: Path
) -> None:
    alone = tmp_path / "kernels"
    alone.mkdir()
    for path in (cpu_kernel.library_path(variant), cpu_kernel.manifest_path(variant)):
        shutil.copy(path, alone / path.name)
    result = probe(bare_env(tmp_path), alone)
    assert result["variant"] == variant
    assert result["attention"] < 1e-5 and result["swiglu"] < 1e-5
    if variant == "avx512bf16":
        assert result["bf16_gemm"] and result["bf16_error"] <= BF16_TOLERANCE, result
    else:
        assert not result["bf16_gemm"] and "built without AVX512-BF16" in result["bf16_error"], result


needs_bf16_cpu = pytest.mark.skipif(
    "avx512bf16" not in cpu_kernel.supported_variants(cpu_kernel._cpu_flags(), platform.machine()),
    reason="this CPU has no AVX512-BF16",
)


@needs_bf16_cpu
def test_a_cpu_with_avx512_bf16_loads_the_bf16_variant_and_its_gemm_gives_torchs_numbers(
    tmp_path: Path,
) -> None:
    result = probe(bare_env(tmp_path))
    assert result["variant"] == "avx512bf16" and result["bf16_gemm"]
    assert result["bf16_error"] <= BF16_TOLERANCE


@needs_bf16_cpu
def test_the_bf16_variant_is_never_picked_on_a_cpu_without_the_flag(tmp_path: Path) -> None:
    # Every variant is in the directory; the CPU says it has AVX-512 but not AVX512-BF16.
    result = probe(bare_env(tmp_path), cpu_kernel.KERNEL_DIR, f"flags\t\t: {X86_V4}")
    assert result["variant"] == "avx512" and not result["bf16_gemm"]


@needs_bf16_cpu
def test_the_variant_setting_runs_the_avx512_variant_on_a_bf16_cpu(tmp_path: Path) -> None:
    result = probe({**bare_env(tmp_path), cpu_kernel.ENV_VARIANT: "avx512"})
    assert result["variant"] == "avx512" and not result["bf16_gemm"]


@pytest.fixture
def kernels_for_another_torch(tmp_path: Path) -> Path:
    """This build's libraries, their manifests saying they were built for torch 2.12.0."""
    for path in cpu_kernel.KERNEL_DIR.iterdir():
        shutil.copy(path, tmp_path / path.name)
    for manifest in tmp_path.glob("*.json"):
        record = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**record, "torch": "2.12.0+cpu"}))
    return tmp_path


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a fresh process: nothing loaded yet, the kernels switched on."""
    monkeypatch.setattr(cpu_kernel, "_state", {})
    monkeypatch.setitem(cpu_kernel._setting, "native_kernels", True)
    monkeypatch.delenv(cpu_kernel.ENV_SWITCH, raising=False)


@pytest.mark.usefixtures("fresh_loader")
def test_a_library_built_for_another_torch_is_refused_and_the_engine_runs_on_torch_ops(
    kernels_for_another_torch: Path,
    tied_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(cpu_kernel, "KERNEL_DIR", kernels_for_another_torch)
    with caplog.at_level(logging.WARNING, logger="frontier_runtime.ops"):
        stats = LLMEngine(tied_dir, max_seq_len=64, num_blocks=8).stats()
    assert (stats.attention_backend, stats.kernels) == ("sdpa-gather", "torch")
    assert cpu_kernel.variant() is None
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, caplog.text
    assert "built for torch 2.12.0+cpu" in refusals[0] and "running on torch ops" in refusals[0]


@pytest.mark.usefixtures("fresh_loader")
def test_a_library_built_from_another_source_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for path in cpu_kernel.KERNEL_DIR.iterdir():
        shutil.copy(path, tmp_path / path.name)
    for manifest in tmp_path.glob("*.json"):
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "source_sha256": "0" * 64}))
    monkeypatch.setattr(cpu_kernel, "KERNEL_DIR", tmp_path)
    with caplog.at_level(logging.WARNING, logger="frontier_runtime.ops"):
        assert not cpu_kernel.load()
    assert "built from another kernels.cpp than the one installed beside it" in caplog.text
    assert "python -m frontier_runtime.ops.build_kernels" in caplog.text


@pytest.mark.usefixtures("fresh_loader")
def test_with_no_variant_built_the_loader_says_how_to_build_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cpu_kernel, "KERNEL_DIR", tmp_path)
    with caplog.at_level(logging.WARNING, logger="frontier_runtime.ops"):
        assert not cpu_kernel.load() and not cpu_kernel.loaded()
    assert "no prebuilt native CPU kernels" in caplog.text and "build_kernels" in caplog.text


@pytest.fixture(scope="module")
def portable_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The portable variant alone, built from this checkout's source into a directory of its own."""
    out = tmp_path_factory.mktemp("portable-kernels")
    build_kernels.build("portable", out)
    return out


def test_the_portable_variant_is_built_without_any_target_flag(portable_build: Path) -> None:
    flags = json.loads(cpu_kernel.manifest_path("portable", portable_build).read_text())["flags"]
    assert not [f for f in flags if f.startswith(("-march", "-mtune", "-mprefer", "-mavx"))], flags


def test_the_portable_variant_loads_and_gives_the_numbers_torch_gives(
    portable_build: Path, tmp_path: Path
) -> None:
    # The directory holds the portable variant alone, so even an AVX-512 CPU loads it.
    result = probe(bare_env(tmp_path), portable_build)
    assert result["variant"] == "portable"
    assert result["attention"] < 1e-5 and result["swiglu"] < 1e-5


def test_the_source_compiles_for_aarch64(tmp_path: Path) -> None:
    # The portable variant is the one an ARM host builds: its flags, for an aarch64 object (torch's
    # headers are the same on every architecture). Debian's g++-aarch64-linux-gnu cross-compiles.
    compiler = shutil.which("aarch64-linux-gnu-g++")
    assert compiler, "the aarch64 cross-compiler is missing: apt-get install g++-aarch64-linux-gnu"
    flags = [*(f for f in build_kernels.COMMON_FLAGS if f != "-shared"), "-c"]
    command = build_kernels._command(compiler, flags, tmp_path / "kernels.o")
    command = [arg for arg in command if not arg.startswith(("-L", "-l"))]  # an object: nothing to link
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "kernels.o").read_bytes()[18:20] == (183).to_bytes(
        2, "little"
    )  # e_machine: EM_AARCH64
