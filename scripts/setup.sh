#!/usr/bin/env bash
# Set up kilocard on a fresh machine: a virtual environment in .venv with the CPU build of torch,
# megatron-core (pinned) and kilocard itself (editable, with test extras). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.kilocard-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # torch first and exactly: the local CPU wheel. An unpinned torch would pull a multi-GB CUDA build.
  .venv/bin/pip install -q --disable-pip-version-check "torch==${KILOCARD_TORCH:-2.13.0}"
  # megatron-core: the bottom of the supported range, exactly (the newest release for Python 3.11)
  .venv/bin/pip install -q --disable-pip-version-check "megatron-core==${KILOCARD_MCORE:-0.16.1}"
  .venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
  touch "$stamp"
fi
# The test oracle: megatron-core 0.19.2 (Megatron-LM formulas) in .oracle/, apart from the pinned one.
bash scripts/install_oracle.sh
