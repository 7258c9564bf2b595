#!/usr/bin/env bash
# The GPU check (docs/real-runs.md, "The GPU check"): on one CUDA GPU, in this order,
#   1. scripts/gpu/gpu_check.py: a vLLM replica's sleep, wake-up, abort (resumed from its partial
#      output) and weight update from the torch trainer, the trainer's fit step, offload and
#      onload, on a tiny model; prints each step's time and the GPU memory in use after it;
#   2. the Megatron adapter test that needs CUDA (test_megatron_adapter.py, marked gpu), which
#      must pass, not skip;
#   3. the tiny example on the GPU (ray.slot {GPU: 1}; one slot, so the trainer and one hybrid
#      vLLM replica share it: rollout.nnodes=0), a few cycles; prints its switch timings.
# Exits non-zero at the first failure. Takes a few minutes, most of it engine start-up.
#
#   bash scripts/gpu/check.sh             # on the GPU machine (the dev venv installed there)
#   bash scripts/gpu/check.sh --dry-run   # anywhere: checks this script, its commands, files and
#                                         # Python, and validates the run file with the GPU overrides
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DYNRES=${DYNRES:-.venv/bin/dynres}
MEGATRON_TEST=packages/dynres-runtime/tests/test_megatron_adapter.py
EXAMPLE=examples/tiny-grpo-cpu.yaml
HELPER=scripts/gpu/gpu_check.py
STEPS=${STEPS:-6}
GPU_SETS=(
  --set 'ray.slot={GPU: 1, CPU: 1}'
  --set rollout.nnodes=0
  --set engines.trainer_options.device=cuda
  --set run.checkpoint_every=0
)
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0

say() { echo "[gpu-check] $*"; }
fail() { say "FAILED: $*"; exit 1; }

dry_run() {
  bash -n "$0" || fail "this script does not parse"
  for cmd in "$PY" "$DYNRES" timeout; do
    command -v "$cmd" >/dev/null || fail "command $cmd not found (bash scripts/install.sh --dev makes .venv)"
  done
  command -v nvidia-smi >/dev/null || say "note: no nvidia-smi here (needed on the GPU machine only)"
  for f in "$MEGATRON_TEST" "$EXAMPLE" "$HELPER"; do
    [ -f "$f" ] || fail "missing file $f"
  done
  "$PY" -m py_compile "$HELPER" || fail "$HELPER does not parse"
  "$PY" "$HELPER" --dry-run || fail "$HELPER cannot import what it needs"
  # The run file with the GPU overrides, checked the way `dynres run` checks it before starting.
  "$PY" - "$EXAMPLE" "${GPU_SETS[@]}" <<'PY' || fail "the tiny example with the GPU overrides is not a valid run"
import sys
from dynres.runtime.realrun import plan_launch

sets = [a for a in sys.argv[2:] if a != "--set"]
plan = plan_launch(sys.argv[1], sets=sets, plots=False, out_dir="/nonexistent-dry-run")
cfg = plan.config
assert cfg.ray.slot.get("GPU") == 1 and cfg.num_standalone_replicas == 0 and cfg.num_hybrid_replicas == 1, cfg.ray
print(f"run file ok: slot {cfg.ray.slot}, {cfg.num_hybrid_replicas} hybrid replica on the trainer's GPU")
PY
  local listed
  listed=$("$PY" -m pytest --collect-only -q -p no:cacheprovider -m gpu "$MEGATRON_TEST" 2>&1) \
    || fail "pytest cannot collect $MEGATRON_TEST: $listed"
  echo "$listed" | grep -q "test_megatron_forward_matches_hf_logits_on_gpu" || fail "no gpu test in $MEGATRON_TEST"
  say "dry run ok: commands, files, Python, run file and the gpu test are in place"
}

if [ "${1:-}" = "--dry-run" ]; then
  dry_run
  exit 0
fi

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this needs a CUDA GPU (use --dry-run elsewhere)"
nvidia-smi -L
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'" || fail "torch sees no GPU"
OUT=$(mktemp -d /tmp/dynres-gpu-XXXXXX)
trap 'rm -rf "$OUT"' EXIT

say "1/3 vLLM sleep, wake-up, abort, weight update; torch trainer (timings below)"
timeout 900 "$PY" "$HELPER" --out "$OUT/engines" || fail "engine checks"

say "2/3 Megatron adapter test on the GPU"
log=$OUT/megatron.log
timeout 900 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs "$MEGATRON_TEST" 2>&1 | tee "$log" || fail "Megatron GPU test"
grep -q " passed" "$log" && ! grep -q "skipped" "$log" || fail "the Megatron GPU test did not run (skipped)"

say "3/3 the tiny example on the GPU, $STEPS cycles"
timeout 1200 "$DYNRES" run "$EXAMPLE" --out "$OUT/tiny" -q --no-plot --steps "$STEPS" "${GPU_SETS[@]}" \
  --set ray.temp_dir="$OUT/ray" || fail "the tiny example on the GPU"
"$PY" - "$OUT/tiny/report.json" <<'PY' || fail "the tiny example's report"
import json, sys

report = json.load(open(sys.argv[1]))
ops = report["operations"]
print(f"{len(report['cycles'])} cycles in {report['end_to_end_s']:.1f} s; {ops['activations']} activations, "
      f"{ops['deactivations']} deactivations; controller overhead {ops['controller_overhead_s']:.3f} s")
print(f"{'switch step':<16} {'calls':>5} {'mean s':>8} {'max s':>8}")
for op in ("offload", "wake_up", "update_weights", "abort", "sleep", "onload"):
    st = ops["engine"].get(op)
    if st:
        print(f"{op:<16} {st['count']:>5} {st['total_s'] / st['count']:8.3f} {st['max_s']:8.3f}")
s = report["samples"]
assert len(report["cycles"]) >= 1 and not report["stopped_early"], report["stopped_early"]
assert s["failed"] == 0 and s["duplicates"] == 0 and not report["quarantined"], (s, report["quarantined"])
PY
say "all GPU checks passed"
