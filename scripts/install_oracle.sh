#!/usr/bin/env bash
# Install the reference oracle: megatron-core 0.19.2 (which ships megatron.training:
# arguments.validate_args, theoretical_memory_usage, training.num_floating_point_operations)
# into .oracle/, apart from the pinned megatron-core 0.16.1 in .venv. Tests import single files
# from it by path (tests/oracle.py). 0.19 requires Python >= 3.12 and imports triton, so on 3.11
# it is forced in with --no-deps --ignore-requires-python, with triton beside it.
# Idempotent: does nothing when .oracle/ already holds this version. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
ORACLE_VERSION=${KILOCARD_ORACLE_VERSION:-0.19.2}
TRITON_VERSION=${KILOCARD_ORACLE_TRITON:-3.6.0}
stamp=.oracle/.installed-$ORACLE_VERSION
if [ -f "$stamp" ]; then
  exit 0
fi
rm -rf .oracle.tmp
mkdir -p .oracle.tmp
PIP=(.venv/bin/pip install -q --disable-pip-version-check --no-deps --ignore-requires-python --target .oracle.tmp)
"${PIP[@]}" "megatron-core==$ORACLE_VERSION"
"${PIP[@]}" "triton==$TRITON_VERSION"
rm -rf .oracle
mv .oracle.tmp .oracle
touch "$stamp"
echo "oracle: megatron-core $ORACLE_VERSION installed in .oracle/"
