"""Build the native CPU kernels ahead of time: ``python -m frontier_runtime.ops.build_kernels``.

    python -m frontier_runtime.ops.build_kernels [--out DIR] [--variant avx512 --variant avx2 ...]

Compiles ``csrc/kernels.cpp`` once per variant into ``DIR`` (default: the package's ``kernels/``,
where ``cpu_kernel.load()`` looks), each library with its manifest beside it. Without
``--variant`` it builds every variant this machine's architecture has: all four on x86-64, the
portable one elsewhere. Needs g++ (or ``$CXX``) and torch's headers; serving needs neither.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from frontier_runtime.ops import cpu_kernel

# -fopenmp: at::parallel_for is an OpenMP pragma inlined from ATen's header; compiled without it the
# kernels run on one thread whatever torch.get_num_threads() says. The libgomp it links is the one
# torch already loaded (same soname), so both share one thread pool.
# -fno-trapping-math: without it GCC will not vectorise exp_neg's float-to-int conversion (it could
# raise an FP exception nobody reads), and every loop that calls it runs scalar.
COMMON_FLAGS = ["-O3", "-fno-trapping-math", "-fopenmp", "-std=c++17", "-shared", "-fPIC"]
# Fixed ISA levels, never -march=native: the library runs on every CPU of its level, not only on
# the one that built it. The portable variant names no -march at all, so it builds on any
# architecture (the compiler's default target: x86-64 baseline with SSE2, armv8-a on aarch64).
# avx512bf16 is x86-64-v4 plus AVX512-BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4 and
# later): the bf16 panel GEMM's dot products (_mm512_dpbf16_ps) and conversions.
VARIANT_FLAGS = {
    "avx512bf16": ["-march=x86-64-v4", "-mavx512bf16", "-mprefer-vector-width=512"],
    "avx512": ["-march=x86-64-v4", "-mprefer-vector-width=512"],
    "avx2": ["-march=x86-64-v3"],
    "portable": [],
}


class BuildError(RuntimeError):
    """A variant that could not be compiled here."""


def default_variants(machine: str = platform.machine()) -> list[str]:
    """Every variant the architecture has: the x86 ISA levels exist only on x86-64."""
    return list(cpu_kernel.VARIANTS) if machine.lower() in ("x86_64", "amd64") else ["portable"]


def build(name: str, out_dir: Path = cpu_kernel.KERNEL_DIR) -> Path:
    """Compile variant ``name`` into ``out_dir`` and write its manifest; returns the library's path."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise BuildError(f"no C++ compiler: {os.environ.get('CXX', 'g++')} is not on PATH")
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = [*COMMON_FLAGS, *VARIANT_FLAGS[name]]
    target = cpu_kernel.library_path(name, out_dir)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        partial = Path(tmp) / target.name
        proc = subprocess.run(_command(compiler, flags, partial), capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"compiling the {name} variant failed:\n{proc.stderr[-3000:]}")
        os.replace(partial, target)  # atomic: a process starting now never loads half a file
    manifest = cpu_kernel.manifest_path(name, out_dir)
    record = {
        "variant": name,
        "torch": torch.__version__,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "machine": platform.machine(),
        "source_sha256": cpu_kernel.source_digest(),
        "flags": flags,
    }
    manifest.with_suffix(".tmp").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(manifest.with_suffix(".tmp"), manifest)
    return target


def _command(compiler: str, flags: list[str], output: Path) -> list[str]:
    from torch.utils import cpp_extension  # only when building: it imports setuptools

    torch_root = Path(torch.__file__).parent
    return [
        compiler,
        *flags,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        # Paths that torch's headers put into error messages (__FILE__) name no build machine's
        # directories, so the same sources and torch give the same bytes anywhere.
        f"-ffile-prefix-map={torch_root}=torch",
        f"-ffile-prefix-map={cpu_kernel.SOURCE_PATH.parent}=csrc",
        *[f"-I{p}" for p in cpp_extension.include_paths()],
        str(cpu_kernel.SOURCE_PATH),
        "-o",
        str(output),
        *[f"-L{p}" for p in cpp_extension.library_paths()],
        "-lc10",
        "-ltorch_cpu",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frontier_runtime.ops.build_kernels", description=__doc__)
    parser.add_argument("--out", type=Path, default=cpu_kernel.KERNEL_DIR, help="where the libraries go")
    parser.add_argument(
        "--variant",
        action="append",
        choices=cpu_kernel.VARIANTS,
        help="a variant to build (repeatable); default: every one this architecture has",
    )
    args = parser.parse_args(argv)
    for name in args.variant or default_variants():
        try:
            path = build(name, args.out)
        except BuildError as exc:
            print(f"build_kernels: {exc}", file=sys.stderr)
            return 1
        print(f"built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
