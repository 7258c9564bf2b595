#!/usr/bin/env bash
# CI check: dynres-runtime runs every command it ships with only its declared dependencies.
# Wheels of core, policies and runtime go into a fresh venv that gets `dynres-runtime` alone
# (no testkit, no ray, no torch, no matplotlib: plots are the [plot] extra); then `dynres run` on a fake-engine local config, `dynres
# simulate` on a preset, `dynres policies list` and `dynres config check` must all succeed.
# ci-lane: beside-lint (scripts/test.sh runs it beside lint: it judges no timing)
set -euo pipefail
source "$(dirname "$0")/_lib.bash"
ci_setup 15-runtime-only

say "building wheels of core, policies, runtime"
for p in dynres-core dynres-policies dynres-runtime; do build_wheel "packages/$p"; done

say "fresh venv with dynres-runtime only"
"$PY" -m venv "$TMP/venv"
V=$TMP/venv/bin
"$V/pip" install -q --find-links "$WHEELS" dynres-runtime >"$TMP/pip.log" 2>&1 || { cat "$TMP/pip.log"; fail "pip install"; }
for absent in dynres.testkit ray torch vllm matplotlib; do
  ! env -u PYTHONPATH "$V/python" -c "import $absent" 2>/dev/null || fail "$absent is importable; the venv must hold only dynres-runtime's dependencies"
done

# Every command runs outside the source tree, so nothing but the installed wheels is importable.
cp examples/fake-minimal.yaml "$TMP/fake-minimal.yaml"
cd "$TMP"
run() {  # run NAME CMD...: the command must exit 0; its output is kept in NAME.out
  local name=$1; shift
  env -u PYTHONPATH "$@" >"$name.out" 2>&1 || { cat "$name.out"; fail "$name: $*"; }
}

run run "$V/dynres" run fake-minimal.yaml --out run-out -q
last=$(tail -n 1 run.out)
[ "$last" = "metrics: run-out/metrics.jsonl; report: run-out/report.json" ] || { cat run.out; fail "dynres run: last line is '$last'"; }
[ "$(wc -l <run-out/metrics.jsonl)" -eq 3 ] || fail "dynres run: metrics.jsonl does not hold 3 cycles"
say "dynres run: $(head -n 1 run.out | cut -c1-100)..."

run simulate "$V/dynres" simulate --preset seed-dynamic-16-16 --set steps=3 --json sim.json
"$V/python" -c "import json; d = json.load(open('sim.json')); assert len(d['steps']) == 3 and d['policy'] == 'default', d.keys()" \
  || fail "dynres simulate: sim.json lacks 3 steps of policy default"
say "dynres simulate: OK"

# Asking for plots without the [plot] extra: exit 2 and one line that names the extra, before any work.
if env -u PYTHONPATH "$V/dynres" simulate --preset seed-dynamic-16-16 --set steps=3 --plot plots >plot.out 2>&1; then
  cat plot.out; fail "dynres simulate --plot succeeded without matplotlib"
fi
[ "$(wc -l <plot.out)" -eq 1 ] && grep -q "dynres-runtime\[plot\]" plot.out || { cat plot.out; fail "--plot without matplotlib: expected one line naming the [plot] extra"; }
say "dynres simulate --plot without matplotlib: $(cat plot.out)"

run policies "$V/dynres" policies list
for name in default fixed_ratio static_fully_async; do grep -q "$name" policies.out || { cat policies.out; fail "policies list lacks $name"; }; done
say "dynres policies list: OK"

run check "$V/dynres" config check fake-minimal.yaml
grep -q "is a valid dynres run file" check.out || { cat check.out; fail "config check did not accept the run file"; }
say "dynres config check: OK"

say "OK: dynres run, simulate, policies list and config check work with only dynres-runtime installed"
