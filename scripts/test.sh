#!/usr/bin/env bash
# Install everything the tests need, lint, run every package's tests, then the wheel/CI checks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
export RAY_AUTH_MODE=disabled
secs() { echo "$(( $(date +%s) - $1 )) s"; }
t=$(date +%s)
bash scripts/lint.sh
echo "== lint took $(secs "$t")"
# A fixed hypothesis seed: CI runs the same examples every time (a red run is reproducible);
# a plain `pytest` run locally keeps drawing new ones. -n auto: one pytest-xdist worker per core,
# at most 4 (each real-engine test starts engines or a Ray cluster of its own: memory, not cores,
# bounds how many run at once).
t=$(date +%s)
.venv/bin/python -m pytest packages examples --hypothesis-seed=0 -n auto --maxprocesses 4 --durations=15 "$@"
echo "== pytest took $(secs "$t")"
for check in scripts/ci/*.sh; do
  [ -e "$check" ] || continue
  echo "== $check"
  t=$(date +%s)
  bash "$check"
  echo "== $check took $(secs "$t")"
done
