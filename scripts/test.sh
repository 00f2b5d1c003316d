#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, start what the tests need, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -q --durations=15 "$@"
