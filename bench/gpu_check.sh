#!/usr/bin/env bash
# Frontier's engine on an NVIDIA GPU, in phases (bench/gpu_check.py says which): each phase's JSON
# lands in $OUT (default gpu-check-results/) before the next starts; under 7 minutes in all.
#
#   bash bench/gpu_check.sh prepare   # here, with PyPI: wheels the GPU machine lacks -> .frontier/gpu-wheels
#   bash bench/gpu_check.sh           # on the GPU machine, from the repository root, no network
#   bash bench/gpu_check.sh --smoke   # the same phases on CPU (a rehearsal of the script)
#
# The GPU machine has python3 (3.12) with torch (CUDA), transformers, safetensors and tokenizers
# only (PyYAML comes with transformers). The engine needs a few more: llguidance (structured output),
# jinja2 (chat templates), pydantic (the engine's settings are the runtime's settings models); carry
# .frontier/gpu-wheels along. The shared names and the settings reader come from hostside/.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.frontier/gpu-wheels
SITE=.frontier/gpu-site
PY=${PYTHON:-python3}

if [[ "${1:-}" == "prepare" ]]; then
  mkdir -p "$WHEELS"
  .venv/bin/pip download -q --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
    -d "$WHEELS" 'llguidance==1.7.6' 'jinja2==3.1.6' 'markupsafe==3.0.3' \
    'pydantic==2.14.4' 'pydantic_core==2.50.5' 'annotated-types==0.8.0' 'typing-inspection==0.4.5' \
    'typing_extensions==4.16.0'
  ls -l "$WHEELS"
  exit 0
fi

if ! "$PY" -c 'import llguidance, jinja2, pydantic' 2>/dev/null; then
  [[ -d "$WHEELS" ]] || { echo "missing $WHEELS: run 'bash bench/gpu_check.sh prepare' where PyPI is reachable" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
OUT_DIR=${OUT:-gpu-check-results}
mkdir -p "$OUT_DIR"
set -o pipefail
PYTHONUNBUFFERED=1 PYTHONPATH="runtime:hostside:$SITE" timeout 480 "$PY" bench/gpu_check.py --out-dir "$OUT_DIR" "$@" \
  2>&1 | tee "$OUT_DIR/gpu_check.log"
