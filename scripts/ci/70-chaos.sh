#!/usr/bin/env bash
# Chaos on real engines (issue 29): one tiny run (Ray + vLLM on CPU + torch, examples/tiny-grpo-cpu.yaml)
# in which a standalone replica's actor process and the hybrid replica's actor process are
# SIGKILLed, both come back, then the whole `dynres run` process group is SIGKILLed and the run
# goes on with `dynres run --resume`. scripts/ci/_chaos.py does it and checks, from the run
# folder's files: each replica back within its limit, nothing quarantined, the ledger exactly
# once over both segments (0 lost, 0 duplicated), cycles and weight_version continuing, the
# trainer's optimizer state and reward picking up where the checkpoint left it. Node loss is
# test_ray_multinode.py (pytest).
# Two engine start-ups dominate its time: 3-9 minutes on 2 idle cores in CI (more when they are busy).
set -euo pipefail
cd "$(dirname "$0")/../.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
OUT=$(mktemp -d /tmp/dynres-chaos-XXXXXX)
# The Ray sessions live in $OUT/ray (short path: Unix sockets) and go away with it.
trap 'rm -rf "$OUT"' EXIT
start=$(date +%s)
status=0
timeout 1200 .venv/bin/python scripts/ci/_chaos.py "$OUT" || status=$?
echo "chaos wall time: $(( $(date +%s) - start )) s"
if [ "$status" -ne 0 ]; then
  echo "== last lines of the runs' logs"
  tail -n 30 "$OUT"/run1.log "$OUT"/run2.log 2>/dev/null || true
fi
exit "$status"
