#!/usr/bin/env bash
# `make lock`: every third-party distribution this repository installs, pinned with its hashes.
#
#   requirements/toolkit.txt  the .venv `make install` builds: toolkit (with dev), runtime, gateway,
#                             host side; CPython 3.11 on linux x86_64, torch's CPU wheel
#   requirements/runtime.txt  the runtime and the host side alone (a runtime-only venv)
#   requirements/gateway.txt  the gateway and the host side alone
#   requirements/image.txt    what runtime/Dockerfile installs besides our two wheels, CUDA torch
#                             among them: CPython 3.12 on glibc 2.39 (the CUDA base's Ubuntu 24.04)
#   requirements/image-cpu.txt the same for the image's CPU variant: CPython 3.11 on glibc 2.36
#                             (the Debian bookworm base), torch's CPU wheel
#
# Our own distributions (frontier, frontier-runtime, frontier-gateway, frontier-hostside) are left
# out: they are built from this tree and installed with --no-deps after the lock.
# uv resolves (a pinned release from PyPI, in its own venv under .frontier/); it honours pip's
# configuration of this machine's indexes and wheel folder only when told, so they are passed here
# from `pip config`. The result must not depend on what is installed: nothing reads the .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3.11}
UV_VERSION=0.13.8
UV_VENV=.frontier/uv-venv
if ! "$UV_VENV/bin/uv" --version 2>/dev/null | grep -q "uv $UV_VERSION"; then
    "$PY" -m venv "$UV_VENV"
    "$UV_VENV/bin/pip" install --quiet "uv==$UV_VERSION"
fi
UV="$UV_VENV/bin/uv"

# The indexes and wheel folders pip is configured with (where torch's CPU wheel lies), for uv.
sources=()
for link in $("$PY" -m pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
    sources+=(--find-links "$link")
done
for index in $("$PY" -m pip config get global.extra-index-url 2>/dev/null || true) ${PIP_EXTRA_INDEX_URL:-}; do
    sources+=(--extra-index-url "$index")
done

ours=(--no-emit-package frontier --no-emit-package frontier-runtime
      --no-emit-package frontier-gateway --no-emit-package frontier-hostside)
common=(--quiet --generate-hashes --no-header --index-strategy unsafe-best-match
        "${sources[@]}" "${ours[@]}")

mkdir -p requirements
in=$(mktemp -d)
trap 'rm -rf "$in"' EXIT

lock() {  # NAME PLATFORM-ARGS... -- REQUIREMENTS...
    local name=$1; shift
    local args=()
    while [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    printf '%s\n' "$@" > "$in/$name.in"
    # The lock as it stands is uv's preference: a version moves only when a declared range or a
    # new dependency makes it (so `make lock-check` in CI fails on a real change, not on a release
    # PyPI published since).
    if [ -f "requirements/$name.txt" ]; then cp "requirements/$name.txt" "$in/$name.txt"; fi
    "$UV" pip compile "${common[@]}" "${args[@]}" "$in/$name.in" -o "$in/$name.txt"
    {
        echo "# $name: written by \`make lock\` (scripts/lock.sh); do not edit. Install with"
        echo "#   pip install --require-hashes --no-deps -r requirements/$name.txt"
        grep -v "^# $name: written by\|^#   pip install --require-hashes" "$in/$name.txt" \
            | sed "s#$in/#requirements/#"
    } > "requirements/$name.txt.tmp"
    mv "requirements/$name.txt.tmp" "requirements/$name.txt"
    echo "requirements/$name.txt: $(grep -c '^[A-Za-z0-9]' "requirements/$name.txt") distributions"
}

# glibc 2.36: Debian bookworm, the machines `make install` runs on and the CPU image's base.
linux=(--python-version 3.11 --python-platform x86_64-manylinux_2_36)
lock toolkit "${linux[@]}" -- "-e ./hostside" "-e ./runtime" "-e ./gateway" "-e .[dev]"
lock runtime "${linux[@]}" -- "-e ./hostside" "-e ./runtime"
lock gateway "${linux[@]}" -- "-e ./hostside" "-e ./gateway"
# The image: both of its stages install every wheel from these with --require-hashes, then our two
# wheels with --no-deps (runtime/Dockerfile's IMAGE_LOCK). The build stage's setuptools and wheel
# are in them. PyPI's Linux torch wheels are CUDA builds whose CUDA libraries are nvidia-* wheels
# (pinned here with the rest); the CPU variant takes torch's CPU wheel, as the toolkit does.
image=("-e ./hostside" "-e ./runtime" "setuptools>=68" "wheel")
# The CUDA image also reads its GPUs' utilisation and memory through NVML (torch.cuda.utilization
# imports pynvml, which nvidia-ml-py provides): the runtime's GPU gauges and the load report's GPU use.
lock image --python-version 3.12 --python-platform x86_64-manylinux_2_39 -- "${image[@]}" "nvidia-ml-py>=12.535,<14"
lock image-cpu "${linux[@]}" -- "${image[@]}"
# What `fab release.build` runs for each release's SBOM and audit, in its own venv
# (.frontier/release-tools-venv, frontier/release/sbom.py): CycloneDX's generator and pip-audit.
lock release-tools "${linux[@]}" -- "cyclonedx-bom==7.5.0" "pip-audit==2.10.1"
