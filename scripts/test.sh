#!/usr/bin/env bash
# Install everything the tests need, lint, run every package's tests, then the wheel/CI checks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
export RAY_AUTH_MODE=disabled
bash scripts/lint.sh
# A fixed hypothesis seed: CI runs the same examples every time (a red run is reproducible);
# a plain `pytest` run locally keeps drawing new ones.
.venv/bin/python -m pytest packages examples --hypothesis-seed=0 "$@"
for check in scripts/ci/*.sh; do
  [ -e "$check" ] || continue
  echo "== $check"
  bash "$check"
done
