#!/usr/bin/env bash
# Create .venv (if missing) and install the dynres distributions into it, editable.
#   scripts/install.sh          core, policies, runtime, testkit
#   scripts/install.sh --dev    the same plus test tools and the engine extras used by the tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip >/dev/null
"${PIP[@]}" -e packages/dynres-core -e packages/dynres-policies -e packages/dynres-runtime -e packages/dynres-testkit
if [[ "${1:-}" == "--dev" ]]; then
  for req in requirements/*.txt; do
    echo "installing $req"
    "${PIP[@]}" -r "$req"
  done
  [ -x scripts/post-install.sh ] && scripts/post-install.sh
fi
echo "dynres installed in .venv"
