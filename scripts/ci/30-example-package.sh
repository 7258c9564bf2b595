#!/usr/bin/env bash
# CI check: the third-party policy flow from built wheels. Builds the example policy distribution
# (examples/dynres-policy-example) and the four dynres wheels, installs them into a fresh venv,
# then does what a policy author would: list the policies, simulate with the new one, run the
# conformance suite through the pytest plugin, and run the package's own tests.
# ci-lane: beside-lint (scripts/test.sh runs it beside lint: it judges no timing)
set -euo pipefail
source "$(dirname "$0")/_lib.bash"
ci_setup 30-example-package
START=$SECONDS

say "building 5 wheels"
for pkg in packages/dynres-core packages/dynres-policies packages/dynres-runtime packages/dynres-testkit \
           examples/dynres-policy-example; do
  build_wheel "$pkg"
done
ls "$WHEELS"
[ "$(ls "$WHEELS"/*.whl | wc -l)" -eq 5 ] || fail "expected 5 wheels in $WHEELS"

say "installing them into a fresh venv"
"$PY" -m venv "$TMP/venv"
BIN=$TMP/venv/bin
# The wheels by path, so nothing of the same name on an index can stand in for them;
# --find-links resolves the dynres-* dependencies between them to these files.
"$BIN/python" -m pip install --disable-pip-version-check -q --find-links "$WHEELS" "$WHEELS"/*.whl \
  >"$TMP/install.log" 2>&1 || { cat "$TMP/install.log"; fail "pip install of the wheels"; }

# Everything below runs outside the repository with a clean environment, so only the
# installed wheels can be imported.
cd "$TMP"
unset PYTHONPATH
export DYNRES_DISABLE_PLUGIN_AUTOLOAD=

say "dynres policies list"
"$BIN/dynres" policies list
"$BIN/dynres" policies list --json >policies.json
"$BIN/python" - <<'PYEOF' || fail "'example' is not listed by dynres policies list"
import json
rows = {row["name"]: row for row in json.load(open("policies.json"))}
assert {"default", "fixed_ratio", "static_fully_async", "example"} <= set(rows), sorted(rows)
assert rows["example"]["distribution"] == "dynres-policy-example", rows["example"]
assert rows["example"]["import_path"] == "dynres_policy_example:ExamplePolicy", rows["example"]
print("listed:", ", ".join(sorted(rows)))
PYEOF

say "dynres simulate --policy example (seed-dynamic-16-16, 3 sync cycles)"
"$BIN/dynres" simulate --preset seed-dynamic-16-16 --set steps=3 --policy example --json sim.json -q \
  || fail "dynres simulate --policy example"
"$BIN/python" - <<'PYEOF' || fail "the simulation did not run the example policy to the end"
import json
# With a single run (no --compare) the JSON is that run's object.
run = json.load(open("sim.json"))
assert run["policy"] == "example", run["policy"]
assert len(run["steps"]) == 3, len(run["steps"])
assert run["end_to_end_s"] > 0
print(f"example: end-to-end {run['end_to_end_s']:.0f} s over {len(run['steps'])} cycles")
PYEOF

say "pytest --dynres-policy example (the conformance suite, no test file)"
mkdir -p empty && (cd empty && "$BIN/python" -m pytest --dynres-policy example -q -p no:cacheprovider) \
  || fail "pytest --dynres-policy example"

say "the example package's own tests, against the installed wheel"
cp -r "$ROOT/examples/dynres-policy-example/tests" example-tests
"$BIN/python" -c "import dynres_policy_example as m, sys; assert 'site-packages' in m.__file__, m.__file__"
"$BIN/python" -m pytest example-tests -q -p no:cacheprovider || fail "the example package's tests"

say "OK in $((SECONDS - START)) s"
