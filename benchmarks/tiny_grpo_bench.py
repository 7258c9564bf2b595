"""End-to-end time of the tiny real run under ``static_fully_async``, ``default`` and ``predictive``.

    .venv/bin/python benchmarks/tiny_grpo_bench.py [--config examples/tiny-grpo-cpu.yaml]
        [--steps N] [--out DIR] [--policies static_fully_async,default,predictive] [--repeats N]
        [--json]

Every run uses the same file (same model seed, prompts, engines and placement); only
``async_training.dynamic_schedule_policy`` (and, for a ``NAME[KEY=VALUE;...]`` entry, read as in
policy_bench.py, its ``dynamic_schedule_policy_params``) changes. ``static_fully_async`` never wakes the hybrid
replica (the trainer's slot only trains), ``default`` lends it to rollout while the trainer waits,
``predictive`` lends it only while its forecast says a switch pays. Run it on a quiet machine:
the runs take turns on the same cores, so anything else running skews the comparison.
The table shows, per policy: end-to-end time (run start to the last cycle, seconds), the mean
cycle time, the hybrid switches, the trainer's wait for samples, the mean cluster utilization,
the reward of the last cycles, and the process wall time including engine start-up.

Two runs with the same decisions can differ by several percent on a 2-core machine (three single
pairs of never-switching runs, predictive against static_fully_async: +5.2%, -1.5%, +4.4%).
``--repeats N`` runs N rounds, each round every policy once, the order rotated per round so that
no policy always runs first; the table then shows medians (end-to-end with its min-max), and each
comparison the median of the per-round ratios with their range.

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
from statistics import mean, median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_bench import check_policy, parse_policy  # noqa: E402  # one reading of NAME[KEY=VALUE;...]


def run_one(config: str, policy: str, steps: int | None, out: Path) -> dict:
    """Run the config under ``policy``; return the numbers of one table row."""
    from dynres.runtime.realrun import execute, load_run_config

    ray_tmp = tempfile.mkdtemp(prefix="dynres-ray-", dir="/tmp")  # private session, removed after
    name, params = parse_policy(policy)
    overrides: dict = {"async_training.dynamic_schedule_policy": name, "ray.temp_dir": ray_tmp}
    overrides.update({f"async_training.dynamic_schedule_policy_params.{k}": v for k, v in params.items()})
    if steps is not None:
        overrides["run.steps"] = steps
    cfg = load_run_config(config, overrides)
    run_dir = out / folder_name(policy)
    t0 = time.perf_counter()
    try:
        outcome = execute(cfg, run_dir, plots=False)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    rep = outcome.report
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
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


def folder_name(policy: str) -> str:
    """The run folder of ``policy``: its name, or for ``module:Class`` and ``path/file.py:Class`` the class
    name, with a ``NAME[KEY=VALUE;...]`` entry's params as ``-KEY=VALUE``."""
    name, params = parse_policy(policy)
    base = name.rsplit(":", 1)[-1] if ":" in name else name
    return base + "".join(f"-{k}={v}" for k, v in params.items())


def rounds(policies: list[str], repeats: int) -> list[list[str]]:
    """The run order: ``repeats`` rounds of every policy, round ``r`` rotated left by ``r``."""
    n = len(policies)
    return [[policies[(r + i) % n] for i in range(n)] for r in range(repeats)]


def summarize(runs: list[dict], policies: list[str]) -> tuple[list[dict], list[str]]:
    """Per-policy medians over the rounds, and one comparison line per policy against the first.

    ``runs`` are :func:`run_one` rows with a ``round`` key. A comparison uses the ratio within each
    round (the runs of one round share the machine's state), and prints their median and range.
    """
    by_policy = {p: [r for r in runs if r["policy"] == p] for p in policies}
    table = []
    for p, rs in by_policy.items():
        e2e = [r["end_to_end_s"] for r in rs]
        row = {k: median(r[k] for r in rs) for k in rs[0] if isinstance(rs[0][k], (int, float)) and k != "round"}
        row.update(policy=p, runs=len(rs), end_to_end_min_s=min(e2e), end_to_end_max_s=max(e2e))
        table.append(row)
    base = policies[0]
    lines = []
    for p in policies[1:]:
        ratios = []
        for r in sorted({x["round"] for x in runs}):
            a = next(x for x in by_policy[base] if x["round"] == r)
            b = next(x for x in by_policy[p] if x["round"] == r)
            ratios.append(b["end_to_end_s"] / a["end_to_end_s"] - 1.0)
        line = f"{folder_name(p)} vs {folder_name(base)}: end-to-end {median(ratios) * 100:+.1f}%"
        if len(ratios) > 1:
            spread = f"{min(ratios) * 100:+.1f}% .. {max(ratios) * 100:+.1f}%"
            line += f" (median of {len(ratios)} rounds; per round {spread})"
        lines.append(line)
    return table, lines


def main(argv: list[str] | None = None) -> int:
    """Run every policy on the same config and print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny-grpo-cpu.yaml"))
    ap.add_argument("--steps", type=int, default=None, help="override run.steps (sync cycles)")
    ap.add_argument("--out", default="/tmp/dynres-tiny-bench", help="run folders: DIR/<policy>, DIR/rep<r>/<policy>")
    ap.add_argument("--policies", default="static_fully_async,default,predictive")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of every policy (order rotated per round)")
    ap.add_argument("--json", action="store_true", help="print every run's row (with its round) as JSON")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.repeats < 1 or not policies or len(set(policies)) != len(policies):
        ap.error("--repeats must be at least 1 and --policies a list of distinct policy names")
    for policy in policies:
        check_policy(policy)  # a malformed entry, unknown policy or bad param stops here, before any run
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    out = Path(args.out)
    runs = []
    order = rounds(policies, args.repeats)
    for rnd, round_policies in enumerate(order):
        for policy in round_policies:
            print(f"round {rnd + 1}/{len(order)}: running {policy} ...", file=sys.stderr, flush=True)
            # One folder per round (as fidelity_bench lays them out): a later round must not
            # overwrite the metrics and report of an earlier one.
            round_out = out / f"rep{rnd}" if args.repeats > 1 else out
            runs.append({**run_one(args.config, policy, args.steps, round_out), "round": rnd})
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    table, lines = summarize(runs, policies)
    width = max(20, *(len(folder_name(p)) for p in policies))
    head = (
        f"{'policy':<{width}} {'end-to-end s':>12} {'min-max s':>13} {'cycle s':>8} {'act/deact':>11} {'wait s':>7} "
        f"{'util':>5} {'reward(last3)':>13} {'wall s':>7}"
    )
    if args.repeats > 1:
        print(f"medians over {args.repeats} rounds")
    print(head)
    print("-" * len(head))
    for r in table:
        print(
            f"{folder_name(r['policy']):<{width}} {r['end_to_end_s']:>12.2f} "
            f"{r['end_to_end_min_s']:>6.2f}-{r['end_to_end_max_s']:<6.2f} {r['mean_cycle_s']:>8.2f} "
            f"{r['activations']:>5g}/{r['deactivations']:<5g} {r['wait_s']:>7.2f} {r['utilization']:>5.2f} "
            f"{r['reward_last3']:>13.3f} {r['wall_s']:>7.1f}"
        )
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
