#!/usr/bin/env bash
# The linters CI runs after the tests (each must pass): ruff (lint + format), import-linter (the
# declared layers), mypy (the typed packages). Run it before every commit.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
"$bin/ruff" check src tests scripts
"$bin/ruff" format --check src tests scripts
PYTHONPATH=src "$bin/lint-imports" --no-logo
"$bin/mypy"
