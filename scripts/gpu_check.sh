#!/usr/bin/env bash
# One prepared GPU check of kilocard's trainer on a machine with one GPU, Python 3.12 and PyTorch,
# but no megatron-core, no Transformer Engine and no network.
#
#   scripts/gpu_check.sh WHEELS_DIR [OUT_FILE]        # bf16 + FP8, reduced-depth Llama-3-8B shape
#   scripts/gpu_check.sh --cpu-smoke [OUT_FILE]       # dry run of the script on a CPU rank (this venv)
#
# WHEELS_DIR holds the wheels to install offline (pip --no-index --find-links): kilocard and its
# dependencies that the machine lacks (megatron-core, hydra-core, omegaconf, antlr4-python3-runtime,
# PyYAML, psutil, packaging, numpy if missing), and transformer_engine wheels if FP8 should run.
# Everything is installed into a fresh venv that sees the system PyTorch (--system-site-packages).
# Prints what could not be installed or run, and writes the results to OUT_FILE (JSON).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

if [[ "${1:-}" == "--cpu-smoke" ]]; then
  out="${2:-gpu_check_smoke.json}"
  py="${PYTHON:-$repo/.venv/bin/python}"
  exec "$py" "$here/gpu_check.py" --cpu-smoke --out "$out"
fi

wheels="${1:?usage: gpu_check.sh WHEELS_DIR [OUT_FILE] | --cpu-smoke [OUT_FILE]}"
out="${2:-gpu_check.json}"
[[ -d "$wheels" ]] || { echo "gpu_check: $wheels is not a directory of wheels" >&2; exit 2; }
python3 -c 'import torch, sys; assert torch.cuda.is_available(), "no CUDA device"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'

venv="${GPU_CHECK_VENV:-$(mktemp -d /tmp/kilocard-gpucheck-venv.XXXX)}"
python3 -m venv --system-site-packages "$venv"
pip() { "$venv/bin/python" -m pip "$@"; }
pip install --quiet --no-index --find-links "$wheels" megatron-core psutil \
  || { echo "gpu_check: could not install megatron-core from $wheels; nothing ran" >&2; exit 1; }
if ls "$wheels" | grep -q '^kilocard-'; then
  pip install --quiet --no-index --find-links "$wheels" kilocard
else
  pip install --quiet --no-index --find-links "$wheels" --no-build-isolation -e "$repo" \
    || { echo "gpu_check: could not install kilocard (no kilocard wheel and its deps are missing from $wheels)" >&2; exit 1; }
fi
if ls "$wheels" | grep -qi '^transformer_engine'; then
  pip install --quiet --no-index --find-links "$wheels" transformer_engine \
    || echo "gpu_check: transformer_engine did not install; FP8 will be reported as not run" >&2
else
  echo "gpu_check: no transformer_engine wheel in $wheels; bf16 runs on Megatron-Core's local spec, FP8 is not run" >&2
fi
"$venv/bin/python" -c 'import megatron.core; print("megatron-core", megatron.core.__version__)'
cd "$repo"
"$venv/bin/python" "$here/gpu_check.py" --out "$out"
