#!/usr/bin/env bash
# Install everything the tests need, lint, run every package's tests, then the wheel/CI checks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
export RAY_AUTH_MODE=disabled
bash scripts/lint.sh
.venv/bin/python -m pytest packages examples "$@"
for check in scripts/ci/*.sh; do
  [ -e "$check" ] || continue
  echo "== $check"
  bash "$check"
done
