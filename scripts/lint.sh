#!/usr/bin/env bash
# Lint the workspace: ruff (rules + format), the import-layer contracts, the size limits
# (scripts/dev/check_sizes.py) and mypy over the distributions, their tests, the benchmarks, the
# dev scripts and the example distribution. Ruff, import-linter and mypy are configured in the root
# pyproject.toml. Run after scripts/install.sh --dev (scripts/test.sh runs this first).
#   bash scripts/lint.sh               # every step
#   bash scripts/lint.sh sizes mypy    # only these steps (.pre-commit-config.yaml runs them one by one)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV_BIN:-.venv/bin}

step() {
  case "$1" in
    ruff) echo "== ruff check"; "$BIN/ruff" check . ;;
    format) echo "== ruff format --check"; "$BIN/ruff" format --check . ;;
    imports) echo "== lint-imports"; "$BIN/lint-imports" ;;
    sizes) echo "== sizes (functions <= 80 lines, modules <= 700)"; "$BIN/python" scripts/dev/check_sizes.py ;;
    mypy)
      local failed=0
      echo "== mypy: the distributions"
      "$BIN/mypy" -p dynres.core -p dynres.policies -p dynres.runtime -p dynres.testkit -p dynres.verl || failed=1
      # Then each folder of tests, the benchmarks, the dev scripts and the example distribution, one
      # run each: pytest imports a folder's files as top-level modules (conftest, *_helpers), and those
      # names repeat across folders, which one mypy run would refuse. The cache makes the later runs
      # cheap; follow_imports = "silent" (pyproject.toml) keeps them from repeating the first run's errors.
      for dir in packages/*/tests benchmarks scripts/dev examples/dynres-policy-example; do
        echo "== mypy $dir"
        "$BIN/mypy" "$dir" || failed=1
      done
      return "$failed"
      ;;
    *) echo "lint.sh: unknown step '$1' (steps: ruff format imports sizes mypy)" >&2; exit 2 ;;
  esac
}

if [ "$#" -eq 0 ]; then
  set -- ruff format imports sizes mypy
fi
for name in "$@"; do
  step "$name"
done
