#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set up, start what the tests need, run pytest.
# With no arguments it also runs the second pass: the trainer, checkpoint/reshard and Megatron-Core
# differential tests (marker mcore_range) again on megatron-core 0.19.2, the top of the supported
# range (.oracle/, installed by scripts/install_oracle.sh, put first on the path). Arguments are
# passed to the first pytest only (and skip the second pass).
# --fast: the unit tier only (marker unit, set by tests/conftest.py; docs/testing.md): no processes,
# no torch, no second pass, on the same workers as the full run; the arguments after it go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
# kilocard's own bytecode, once: where PYTHONDONTWRITEBYTECODE is set (CI machines) every process of the suite
# would compile the modules it imports from source (pip compiled the installed packages already)
.venv/bin/python -m compileall -q src
# Two pytest-xdist workers by default: the Slurm tests run on one, in order, while the other takes the rest; a
# module, or a page of the docs test, stays whole on one worker (tests/conftest.py, docs/testing.md).
# KILOCARD_TEST_WORKERS=0: one process (for --pdb, or to read a test's output in order).
WORKERS=${KILOCARD_TEST_WORKERS:-2}
if [ "${1:-}" = "--fast" ]; then
  shift
  exec .venv/bin/python -m pytest -q --durations=10 -m unit -n "$WORKERS" "$@"
fi
.venv/bin/python -m pytest -q --durations=40 -n "$WORKERS" "$@"
if [ "$#" -eq 0 ]; then
  echo "--- second pass: megatron-core 0.19.2 (marker mcore_range) ---"
  # NVRx 0.4.1 (Python 3.11's newest) is hidden: megatron-core 0.19 refuses NVRx < 0.6.0 at import
  PYTHONPATH="$PWD/.oracle:$PWD/tests/hide_nvrx" KILOCARD_EXPECT_MCORE=0.19.2 \
    .venv/bin/python -m pytest -q --durations=5 -n "$WORKERS" -p no:cacheprovider -m mcore_range
fi
