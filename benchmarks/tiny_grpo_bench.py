"""End-to-end time of the tiny real run under ``static_fully_async``, ``default`` and ``predictive``.

    .venv/bin/python benchmarks/tiny_grpo_bench.py [--config examples/tiny-grpo-cpu.yaml]
        [--steps N] [--out DIR] [--policies static_fully_async,default,predictive] [--json]

Every run uses the same file (same model seed, prompts, engines and placement); only
``async_training.dynamic_schedule_policy`` changes. ``static_fully_async`` never wakes the hybrid
replica (the trainer's slot only trains), ``default`` lends it to rollout while the trainer waits,
``predictive`` lends it only while its forecast says a switch pays. Run it on a quiet machine:
the runs take turns on the same cores, so anything else running skews the comparison.
The table shows, per policy: end-to-end time (run start to the last cycle, seconds), the mean
cycle time, the hybrid switches, the trainer's wait for samples, the mean cluster utilization,
the reward of the last cycles, and the process wall time including engine start-up.

On a CPU-only machine every engine shares the same cores, so the hybrid replica adds no compute
and each switch costs engine time: the comparison there shows the mechanism's overhead, not
the speed-up that separate accelerators give.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

ROOT = Path(__file__).resolve().parents[1]


def run_one(config: str, policy: str, steps: int | None, out: Path) -> dict:
    """Run the config under ``policy``; return the numbers of one table row."""
    from dynres.runtime.realrun import execute, load_run_config

    ray_tmp = tempfile.mkdtemp(prefix="dynres-ray-", dir="/tmp")  # private session, removed after
    overrides: dict = {"async_training.dynamic_schedule_policy": policy, "cluster.temp_dir": ray_tmp}
    if steps is not None:
        overrides["run.steps"] = steps
    cfg = load_run_config(config, overrides)
    t0 = time.perf_counter()
    try:
        outcome = execute(cfg, out / policy, plots=False)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    rep = outcome.report
    records = [json.loads(x) for x in (out / policy / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["cycle_mean/reward/mean"] for r in records if "cycle_mean/reward/mean" in r]
    return {
        "policy": policy,
        "end_to_end_s": rep.end_to_end_s,
        "mean_cycle_s": mean(c.duration_s for c in rep.cycles),
        "activations": rep.operations.activations,
        "deactivations": rep.operations.deactivations,
        "wait_s": sum(sum(c.step_wait_times) for c in rep.cycles),
        "utilization": mean(r["dynamic_resource/resource_utilization"] for r in records),
        "reward_last3": mean(rewards[-3:]) if rewards else float("nan"),
        "samples_generated": rep.samples.generated,
        "wall_s": wall,
        "engines_start_s": outcome.backend.get("engines_start_s"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run every policy on the same config and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny-grpo-cpu.yaml"))
    ap.add_argument("--steps", type=int, default=None, help="override run.steps (sync cycles)")
    ap.add_argument("--out", default="/tmp/dynres-tiny-bench")
    ap.add_argument("--policies", default="static_fully_async,default,predictive")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    out = Path(args.out)
    rows = []
    for policy in args.policies.split(","):
        print(f"running {policy} ...", file=sys.stderr, flush=True)
        rows.append(run_one(args.config, policy.strip(), args.steps, out))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = (
        f"{'policy':<20} {'end-to-end s':>12} {'cycle s':>8} {'act/deact':>9} {'wait s':>7} "
        f"{'util':>5} {'reward(last3)':>13} {'wall s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['policy']:<20} {r['end_to_end_s']:>12.2f} {r['mean_cycle_s']:>8.2f} "
            f"{r['activations']:>4}/{r['deactivations']:<4} {r['wait_s']:>7.2f} {r['utilization']:>5.2f} "
            f"{r['reward_last3']:>13.3f} {r['wall_s']:>7.1f}"
        )
    a = rows[0]
    for b in rows[1:]:
        change = (b["end_to_end_s"] - a["end_to_end_s"]) / a["end_to_end_s"] * 100
        print(f"{b['policy']} vs {a['policy']}: end-to-end {change:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
