#!/usr/bin/env bash
# Lint the workspace: ruff (rules + format), the import-layer contracts, the size limits
# (scripts/dev/check_sizes.py) and mypy over every distribution. Ruff, import-linter and mypy are
# configured in the root pyproject.toml. Run after scripts/install.sh --dev (scripts/test.sh runs
# this first).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV_BIN:-.venv/bin}
echo "== ruff check"; "$BIN/ruff" check .
echo "== ruff format --check"; "$BIN/ruff" format --check .
echo "== lint-imports"; "$BIN/lint-imports"
echo "== sizes (functions <= 80 lines, modules <= 700)"; "$BIN/python" scripts/dev/check_sizes.py
echo "== mypy"
"$BIN/mypy" -p dynres.core -p dynres.policies -p dynres.runtime -p dynres.testkit -p dynres.verl
