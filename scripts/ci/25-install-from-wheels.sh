#!/usr/bin/env bash
# CI check: the install-from-wheels recipe of docs/installing.md, run verbatim in a copy of the
# sources (build outputs left out), must give a working `dynres` with plots and the testkit.
# ci-lane: beside-lint (scripts/test.sh runs it beside lint: it judges no timing)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
say() { echo "[25-install-from-wheels] $*"; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dynres-wheels.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# The first bash block under the "From wheels built from the repository" heading.
awk '/^### From wheels built from the repository/{s=1} s && /^```bash/{f=1; next} f && /^```/{exit} f{print}' \
  docs/installing.md >"$TMP/recipe.sh"
[ -s "$TMP/recipe.sh" ] || { say "FAILED: no recipe block in docs/installing.md"; exit 1; }
say "recipe:"; sed 's/^/    /' "$TMP/recipe.sh"

mkdir -p "$TMP/repo/packages"
for p in dynres-core dynres-policies dynres-runtime dynres-testkit; do
  (cd packages && tar --exclude='*.egg-info' --exclude=__pycache__ --exclude=build --exclude=dist -cf - "$p") \
    | tar -xf - -C "$TMP/repo/packages"
done
cd "$TMP/repo"
sed -i "s/python3.11 /$PY /g" "$TMP/recipe.sh"
env -u PYTHONPATH bash -euo pipefail "$TMP/recipe.sh" >"$TMP/out.txt" 2>&1 || { cat "$TMP/out.txt"; say "FAILED: the recipe"; exit 1; }
tail -n 1 "$TMP/out.txt" | grep -q "dynres, version 0.1.0" || { cat "$TMP/out.txt"; say "FAILED: no version line"; exit 1; }
[ "$(ls dist/*.whl | wc -l)" -eq 4 ] || { ls dist; say "FAILED: expected 4 wheels in dist/"; exit 1; }
V=.venv-wheels/bin
env -u PYTHONPATH "$V/python" -c "import dynres.runtime, dynres.testkit, matplotlib; assert 'site-packages' in dynres.runtime.__path__[0]"
env -u PYTHONPATH "$V/dynres" simulate --preset seed-dynamic-16-16 --set steps=2 -q --plot plots >/dev/null
[ -f plots/mq_size.png ] || { say "FAILED: no plot from the wheel install"; exit 1; }
env -u PYTHONPATH "$V/pytest" -q -p no:cacheprovider --dynres-policy fixed_ratio -k "check_policy_api or check_no_clock_reads" >"$TMP/pytest.txt" 2>&1 \
  || { cat "$TMP/pytest.txt"; say "FAILED: the testkit plugin from the wheel"; exit 1; }
say "OK: the docs/installing.md wheels recipe installs a working dynres (CLI, plots, testkit)"
