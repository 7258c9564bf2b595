#!/usr/bin/env bash
# CI check: the README's first command works verbatim in a fresh venv (plain, non-editable
# installs of core, policies and runtime, so the simulator presets must ship as package data),
# and the seed comparison it prints has the published shape (dynamic >= 10% faster than both
# static splits).
# ci-lane: beside-lint (scripts/test.sh runs it beside lint: it judges no timing)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dynres-readme.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
say() { echo "[20-readme-simulate] $*"; }

# The first command of the README's first bash block.
CMD=$(awk '/^```bash/{f=1; next} f && /^```/{exit} f && /dynres simulate/{print; exit}' README.md)
[ -n "$CMD" ] || { say "FAILED: no 'dynres simulate' command in README.md's first bash block"; exit 1; }
case "$CMD" in *"python3.11 -m venv .venv"*) ;; *) say "FAILED: README command does not create .venv: $CMD"; exit 1;; esac

# A copy of the sources without build outputs, so nothing of the dev tree (egg-info, .venv) leaks in.
mkdir -p "$TMP/repo/packages"
for p in dynres-core dynres-policies dynres-runtime; do
  (cd packages && tar --exclude='*.egg-info' --exclude=__pycache__ --exclude=build --exclude=dist -cf - "$p") \
    | tar -xf - -C "$TMP/repo/packages"
done

say "running: $CMD"
cd "$TMP/repo"
CMD=${CMD//python3.11/$PY}
env -u PYTHONPATH bash -c "$CMD --json seed.json" >"$TMP/out.txt" 2>&1 || { cat "$TMP/out.txt"; say "FAILED: the README command"; exit 1; }
cat "$TMP/out.txt" | tail -12

env -u PYTHONPATH .venv/bin/python - <<'PYEOF'
import json
import sys

import dynres.runtime

assert "site-packages" in dynres.runtime.__path__[0], dynres.runtime.__path__
runs = {r["scenario"]: r for r in json.load(open("seed.json"))["runs"]}
dyn = runs["seed-dynamic-16-16"]["end_to_end_s"]
for other in ("seed-static-16-16", "seed-static-8-24"):
    assert dyn <= 0.9 * runs[other]["end_to_end_s"], (other, dyn, runs[other]["end_to_end_s"])
for r in runs.values():
    assert r["end_to_end_s"] >= r["lower_bound_s"] > 0, r["scenario"]
print("seed shape OK:", {k: round(v["end_to_end_h"], 3) for k, v in runs.items()})
PYEOF
say "OK: the README's first command runs from a fresh venv and reproduces the seed's shape"
