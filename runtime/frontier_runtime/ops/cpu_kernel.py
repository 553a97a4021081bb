"""The native CPU kernels of ``csrc/kernels.cpp``: built ahead of time in variants, one loaded at run time.

``python -m frontier_runtime.ops.build_kernels`` (run by ``make install``, by the release wheel's
build where the libraries are missing, and by the image's builder stage) compiles the source into
``kernels/`` four times: ``avx512bf16`` (x86-64-v4 with AVX512-BF16: the avx512 variant plus the
bf16 panel GEMM), ``avx512`` (x86-64-v4, 512-bit vectors, the panel GEMM for float32 and int8
weights), ``avx2`` (x86-64-v3) and ``portable`` (no -march: any x86-64 CPU, and the only variant on
other architectures). A manifest beside each library names the torch release and C++ ABI it was
built against, the machine, and the digest of the source it was built from.

``load()`` picks the best variant this CPU runs (its /proc/cpuinfo flags against the x86-64-v4 and
-v3 levels and avx512_bf16; ``FRONTIER_KERNEL_VARIANT=<name>`` holds it to that variant or a lesser
one, e.g. ``avx512`` to run a CPU with AVX512-BF16 without the bf16 panel GEMM), checks the
manifest and loads the library; it never compiles, so it needs no compiler
and no writable cache. Where no variant is built, or the one found was built for another torch,
another machine or another source, it logs why once and returns False: the caller then uses the
torch path. It also returns False, loading nothing, while the kernels are switched off
(``use_native_kernels``; ``FRONTIER_NATIVE_KERNELS=0`` overrides the setting).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import threading
from pathlib import Path

import torch

log = logging.getLogger("frontier_runtime.ops")

KERNEL_DIR = Path(__file__).parent / "kernels"
SOURCE_PATH = Path(__file__).parent / "csrc" / "kernels.cpp"
VARIANTS = ("avx512bf16", "avx512", "avx2", "portable")  # best first
# The /proc/cpuinfo flags of the ISA levels the x86 variants are compiled for (-march=x86-64-v3 and
# -v4): the compiler may emit any instruction of its level, not only the vector ones.
_X86_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})
_X86_V4 = _X86_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
_NEEDS = {
    "avx512bf16": _X86_V4 | {"avx512_bf16"},
    "avx512": _X86_V4,
    "avx2": _X86_V3,
    "portable": frozenset(),
}

_lock = threading.Lock()
_state: dict[str, str | None] = {}  # "variant": the one loaded, None where none could be
_setting = {"native_kernels": True}
_switch: dict[tuple[str | None, bool], bool] = {}  # (raw $FRONTIER_NATIVE_KERNELS, setting) -> enabled
ENV_SWITCH = "FRONTIER_NATIVE_KERNELS"
ENV_VARIANT = "FRONTIER_KERNEL_VARIANT"  # the best variant to consider (A/B runs, tests)


def use_native_kernels(setting: bool) -> None:
    """The engine's ``native_kernels`` setting; process-wide, since a loaded library stays loaded."""
    _setting["native_kernels"] = setting


def enabled() -> bool:
    """Whether the native kernels may be used: ``$FRONTIER_NATIVE_KERNELS`` if set, else the setting."""
    # Asked several times per layer per step: the answer is kept per (variable, setting) pair, so a
    # change of either is still seen at once while the string is parsed only the first time.
    key = (os.environ.get(ENV_SWITCH), _setting["native_kernels"])
    answer = _switch.get(key)
    if answer is None:
        answer = _switch[key] = _resolve_switch(*key)
    return answer


def _resolve_switch(env: str | None, setting: bool) -> bool:
    value = (env or "").strip().lower()
    if not value:
        return setting
    if value not in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        raise ValueError(f"{ENV_SWITCH}={value!r}: expected 0 or 1")
    return value in ("1", "true", "yes", "on")


def loaded() -> bool:
    """Whether this process has loaded a variant of the kernels' library."""
    return _state.get("variant") is not None


def variant() -> str | None:
    """The variant this process loaded (``avx512bf16``, ``avx512``, ``avx2``, ``portable``), or None."""
    return _state.get("variant")


def load() -> bool:
    """Make ``torch.ops.frontier.*`` available from the best prebuilt variant; False if none fits
    this CPU and torch, or the kernels are switched off."""
    if not enabled():
        return False
    if "variant" not in _state:
        with _lock:
            if "variant" not in _state:
                _state["variant"] = _load_best(
                    KERNEL_DIR,
                    capped(supported_variants(_cpu_flags(), platform.machine()), os.environ.get(ENV_VARIANT)),
                )
    return _state["variant"] is not None


def supported_variants(cpu_flags: str, machine: str) -> list[str]:
    """The variants a CPU with these /proc/cpuinfo ``flags`` runs, best first."""
    if machine.lower() not in ("x86_64", "amd64"):
        return ["portable"]
    have = set(cpu_flags.split())
    return [name for name in VARIANTS if _NEEDS[name] <= have]


def capped(candidates: list[str], best: str | None) -> list[str]:
    """``candidates`` from variant ``best`` down (all of them where ``best`` is unset or empty)."""
    if not best:
        return candidates
    if best not in VARIANTS:
        raise ValueError(f"{ENV_VARIANT}={best!r}: expected one of {', '.join(VARIANTS)}")
    return [name for name in candidates if VARIANTS.index(name) >= VARIANTS.index(best)]


def library_path(name: str, directory: Path = KERNEL_DIR) -> Path:
    return directory / f"frontier_kernels-{name}.so"


def manifest_path(name: str, directory: Path = KERNEL_DIR) -> Path:
    return directory / f"frontier_kernels-{name}.json"


def source_digest() -> str:
    return hashlib.sha256(SOURCE_PATH.read_bytes()).hexdigest()


def _load_best(directory: Path, candidates: list[str]) -> str | None:
    """Load the first of ``candidates`` built in ``directory``; None (and a warning) if none can be."""
    for name in candidates:
        path = library_path(name, directory)
        if not path.is_file():
            continue
        problem = _mismatch(manifest_path(name, directory))
        if problem:
            log.warning("native CPU kernels %s refused, running on torch ops: %s", path, problem)
            return None
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError) as exc:
            log.warning("native CPU kernels %s failed to load, running on torch ops: %s", path, exc)
            return None
        log.info("native CPU kernels: the %s variant (%s)", name, path)
        return name
    log.warning(
        "no prebuilt native CPU kernels in %s for this CPU (it runs: %s), running on torch ops; "
        "build them with `python -m frontier_runtime.ops.build_kernels`",
        directory,
        ", ".join(candidates),
    )
    return None


def _mismatch(manifest: Path) -> str:
    """Why the library beside ``manifest`` must not be loaded into this process ("" if it may)."""
    rebuild = "rebuild with `python -m frontier_runtime.ops.build_kernels`"
    try:
        built = json.loads(manifest.read_text())
    except (OSError, ValueError) as exc:
        return f"its manifest {manifest} is unreadable ({exc}); {rebuild}"
    machine, abi = platform.machine(), bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    if built.get("machine") != machine:
        return f"built for {built.get('machine')}, this machine is {machine}"
    # The release and the C++ ABI decide whether the library links against this libtorch: CPU and
    # CUDA builds of one release (2.13.0+cpu, 2.13.0+cu128) share libtorch_cpu's interface.
    if _release(str(built.get("torch"))) != _release(torch.__version__) or built.get("cxx11_abi") != abi:
        return (
            f"built for torch {built.get('torch')} (C++11 ABI {built.get('cxx11_abi')}), this process runs "
            f"torch {torch.__version__} (C++11 ABI {abi}); {rebuild}"
        )
    # Checked where the source is installed beside the libraries (a checkout, the wheel, the image):
    # a library built before the source last changed would run the old kernels.
    if SOURCE_PATH.is_file() and built.get("source_sha256") != source_digest():
        return f"built from another {SOURCE_PATH.name} than the one installed beside it; {rebuild}"
    return ""


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""
