#!/usr/bin/env bash
# The tiny real run: `dynres run examples/tiny-grpo-cpu.yaml --steps 24` (2 standalone + 1 hybrid
# vLLM replicas on CPU, torch trainer, Ray actors, default policy), then checks from its files:
#   - the reward rises (mean of the last half of the cycles > mean of the first 3 + 0.1);
#   - the hybrid replica was activated and deactivated several times;
#   - every admitted sample is accounted for: consumed, dropped stale, still queued, or kept
#     partial at the end; nothing failed and nothing was produced twice;
#   - the log shows the controller's own overhead next to the engines' sleep/wake_up/abort times.
# Must finish in under 10 minutes (the run is killed at 600 s).
# 24 cycles, not the example's 16, and the last half, not the last 3: the toy policy (trained
# asynchronously, on samples up to a cycle stale) often wanders near 0.5 for 8-12 cycles before it
# learns the rule, and can lose some of it again. Checked on the last 3 of 16 cycles, 2 of 15
# recorded runs failed (0.478 -> 0.522, 0.527 -> 0.543). In 9 probe runs of 24 cycles the last
# half beat the first 3 by 0.18 to 0.46 (the last 3 by as little as 0.07); the 8 cycles cost ~10 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
OUT=$(mktemp -d /tmp/dynres-tiny-XXXXXX)
# The Ray session lives in $OUT/ray (short path: Unix sockets) and goes away with it.
trap 'rm -rf "$OUT"' EXIT
start=$(date +%s)
timeout 600 .venv/bin/dynres run examples/tiny-grpo-cpu.yaml --out "$OUT/run" -q --steps 24 \
  --set ray.temp_dir="$OUT/ray" 2>&1 | tee "$OUT/run.log"
echo "tiny run wall time: $(( $(date +%s) - start )) s"
.venv/bin/python - "$OUT" <<'PY'
import json, re, sys
from pathlib import Path

out = Path(sys.argv[1])
log = (out / "run.log").read_text()
records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
report = json.loads((out / "run" / "report.json").read_text())
failures = []

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)

key = "cycle_mean/reward/mean"
rewards = [r[key] for r in records if key in r]
check(len(rewards) == len(records) >= 6, f"{len(records)} cycles with a reward each")
half = rewards[len(rewards) // 2 :]
first, last = sum(rewards[:3]) / 3, sum(half) / len(half)
check(last > first + 0.1, f"reward rises: first 3 cycles {first:.3f} -> last {len(half)} cycles {last:.3f}")
ops = report["operations"]
check(ops["activations"] >= 3 and ops["deactivations"] >= 3,
      f"hybrid activated {ops['activations']}x and deactivated {ops['deactivations']}x")
check(sum(r["activated"] for r in records) >= 3 and sum(r["deactivated"] for r in records) >= 3,
      "activations/deactivations spread over the cycles")
s = report["samples"]
check(s["failed"] == 0 and s["duplicates"] == 0, f"no failed ({s['failed']}) or duplicate ({s['duplicates']}) sample")
check(s["generated"] == s["consumed"] + s["dropped_stale"] and s["queued_at_end"] == 0,
      f"every generated sample was consumed or dropped stale: generated {s['generated']} = "
      f"consumed {s['consumed']} + dropped stale {s['dropped_stale']} (queued at end {s['queued_at_end']})")
check(s["admitted"] == s["generated"] + s["partial_at_end"],
      f"admitted {s['admitted']} = generated {s['generated']} + partial at end {s['partial_at_end']}")
check(sum(r["samples_consumed"] for r in records) == s["consumed"], "per-cycle consumed adds up")
check(all(k in records[0] for k in ("dynamic_resource/resource_utilization", "dynamic_resource/mq_size")),
      "dynamic_resource/* keys in every JSONL record")
check(re.search(r"controller overhead [0-9.]+ s", log) is not None, "log: controller overhead")
for op in ("sleep", "wake_up", "abort"):
    check(re.search(rf"engine {op}\s+\d+ calls\s+total\s+[0-9.]+ s", log) is not None, f"log: engine {op} time")
check(not report["quarantined"] and not report["op_failures"], "no replica lost, no operation failed")
plots = sorted(p.name for p in (out / "run" / "plots").glob("*.png"))
check(len(plots) >= 1, f"plots: {', '.join(plots)}")
sys.exit(1 if failures else 0)
PY
