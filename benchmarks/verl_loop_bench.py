"""A policy in the dynres runtime against the same policy inside verl's trainer, on every simulator preset.

    .venv/bin/python benchmarks/verl_loop_bench.py [--seeds N] [--jobs J] [--scenario NAME ...]
        [--policy NAME] [--json FILE]

For each preset (dynamic scheduling on, duplicates of another preset skipped, as in
``policy_bench.py``) and seeds ``0 .. N-1``, it simulates ``--policy`` (default ``predictive``) twice
on the same engines and workload: in the dynres runtime (``dynres simulate``) and as
``dynres:<policy>`` inside verl 0.9.1's ``DynamicResourceController`` and trainer order
(``dynres simulate --host verl``, see ``dynres.runtime.sim.verl_host``). Per scenario it prints both
mean end-to-end times (hours), the gap (verl loop / dynres runtime - 1, in percent), the mean
switches of each, and the policy's time over ``default`` in each host (dynres's ``default`` in the
runtime, verl's own in the verl loop), with their geometric means: what the policy gains over the
default where it runs. Before the table, a check of the verl host itself: verl's own ``default`` in the
verl loop against dynres's ``default`` in the dynres runtime on ``seed-dynamic-16-16`` seed 0, once
with the dynres runtime's timing (the decisions must be the same and the times equal) and once with
verl's (its 1 s queue poll and staleness reset after the activation). The last line is

    verl_loop_worst_gap_pct=<float> scenarios=<int>

the worst |verl loop / dynres runtime - 1| over the scenarios, in percent. Needs verl and
dynres-verl installed (``scripts/install.sh --dev``). Nothing here is a test; the numbers are for
reading.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from policy_bench import DYNAMIC_ON, scenarios  # same directory (a script's own is on sys.path): one preset list

VALIDATION_PRESET = "seed-dynamic-16-16"
TARGET_PCT = 1.0


def run_one(job: tuple[str, str, str, int, str]) -> dict[str, Any]:
    """One simulation: (scenario, policy name, host, seed, verl timing) -> its end-to-end time and switches."""
    from dynres.runtime.sim import simulate, verl_host

    scenario, policy, host, seed, timing = job
    kwargs: dict[str, Any] = {}
    if host == "verl":
        kwargs["verl_timing"] = verl_host.DYNRES_TIMING if timing == "dynres" else verl_host.VERL_TIMING
    r = simulate(scenario, policy=policy, seed=seed, host=host, overrides=DYNAMIC_ON, **kwargs)
    return {
        "scenario": scenario,
        "policy": policy,
        "host": host,
        "seed": seed,
        "end_to_end_s": r.end_to_end_s,
        "switches": r.switches,
    }


def validate() -> dict[str, Any]:
    """verl's default in the verl loop against dynres's default, on the validation preset, both timings."""
    from dynres.runtime.sim import simulate, verl_host

    ours = simulate(VALIDATION_PRESET, policy="default", seed=0)
    decisions = [(c.activated, c.deactivate_wait_samples) for c in ours.report.cycles]
    out: dict[str, Any] = {"dynres_s": ours.end_to_end_s}
    for name, timing in (("dynres_timing", verl_host.DYNRES_TIMING), ("verl_timing", verl_host.VERL_TIMING)):
        theirs = simulate(VALIDATION_PRESET, policy="default", seed=0, host="verl", verl_timing=timing)
        same = [(c.activated, c.deactivate_wait_samples) for c in theirs.report.cycles]
        out[name] = {
            "verl_s": theirs.end_to_end_s,
            "gap_pct": (theirs.end_to_end_s / ours.end_to_end_s - 1) * 100,
            "same_decisions": same == decisions,
            "first_different_cycle": next(
                (i for i, (a, b) in enumerate(zip(decisions, same, strict=False)) if a != b), None
            ),
        }
    return out


def summarise(rows: list[dict[str, Any]], names: list[str], policy: str) -> list[dict[str, Any]]:
    """Per scenario: mean time and switches of the policy per host, the gap, and each host's ratio to default."""

    def mean(name: str, pol: str, host: str, key: str = "end_to_end_s") -> float:
        return statistics.fmean(r[key] for r in rows if (r["scenario"], r["policy"], r["host"]) == (name, pol, host))

    table = []
    for name in names:
        dyn, ver = mean(name, policy, "dynres"), mean(name, "dynres:" + policy, "verl")
        table.append(
            {
                "scenario": name,
                "dynres_h": dyn / 3600,
                "verl_h": ver / 3600,
                "gap_pct": (ver / dyn - 1) * 100,
                "dynres_switches": mean(name, policy, "dynres", "switches"),
                "verl_switches": mean(name, "dynres:" + policy, "verl", "switches"),
                "vs_default_dynres": dyn / mean(name, "default", "dynres"),
                "vs_default_verl": ver / mean(name, "default", "verl"),
            }
        )
    return table


def print_report(check: dict[str, Any], table: list[dict[str, Any]], policy: str, seeds: int, timing: str) -> None:
    """The validation lines, the table, the target line and the summary line."""
    for name in ("dynres_timing", "verl_timing"):
        v = check[name]
        print(
            f"check: verl's default in the verl loop ({name.replace('_', ' ')}) vs dynres default, "
            f"{VALIDATION_PRESET} seed 0: {v['gap_pct']:+.2f}% end-to-end, same decisions: "
            f"{'yes' if v['same_decisions'] else 'no, from cycle ' + str(v['first_different_cycle'])}"
        )
    print()
    print(f"{policy} (dynres runtime) vs dynres:{policy} (verl loop, {timing} timing), mean of {seeds} seeds")
    print("(x dflt: the policy's time over its host's default: dynres's in the runtime, verl's own in the verl loop)")
    head = ("scenario", "dynres h", "verl h", "gap", "sw dyn", "sw verl", "x dflt dyn", "x dflt verl")
    widths = (-26, 9, 9, 9, 7, 8, 11, 12)
    print("".join(f"{h:<{-w}}" if w < 0 else f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for row in table:
        print(
            f"{row['scenario']:<26}{row['dynres_h']:>9.3f}{row['verl_h']:>9.3f}{row['gap_pct']:>+8.2f}%"
            f"{row['dynres_switches']:>7.1f}{row['verl_switches']:>8.1f}"
            f"{row['vs_default_dynres']:>11.4f}{row['vs_default_verl']:>12.4f}"
        )
    geo_dyn = math.exp(statistics.fmean(math.log(r["vs_default_dynres"]) for r in table))
    geo_verl = math.exp(statistics.fmean(math.log(r["vs_default_verl"]) for r in table))
    print(f"geomean {policy} / default: {geo_dyn:.4f} in the dynres runtime, {geo_verl:.4f} inside verl")
    worst = max(abs(r["gap_pct"]) for r in table)
    over = [r["scenario"] for r in table if abs(r["gap_pct"]) > TARGET_PCT]
    verdict = "PASS" if not over else "FAIL (" + ", ".join(over) + ")"
    print(f"target: every scenario within {TARGET_PCT:g}%: {verdict}")
    print(f"verl_loop_worst_gap_pct={worst:.3f} scenarios={len(table)}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per scenario and host (default 3)")
    ap.add_argument("--jobs", type=int, default=2, help="simulations run in parallel (default 2)")
    ap.add_argument("--scenario", action="append", help="a preset to run (repeatable; default every preset)")
    ap.add_argument("--policy", default="predictive", help="the dynres policy compared (default predictive)")
    ap.add_argument(
        "--verl-timing",
        choices=("verl", "dynres"),
        default="verl",
        help="the verl loop's trainer timing: verl 0.9.1's (default), or the dynres runtime's, to see how "
        "much of a gap verl's 1 s queue poll and late staleness reset make",
    )
    ap.add_argument("--json", help="also write the rows and the table to this file")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        ap.error("--seeds and --jobs must be >= 1")
    from dynres.runtime.sim.verl_host import check_verl_policy

    check_verl_policy("dynres:" + args.policy)  # a missing bridge or policy stops the bench before any run
    names = scenarios(args.scenario)
    jobs = [
        (name, pol, host, seed, args.verl_timing)
        for name in names
        for seed in range(args.seeds)
        for host, pol in (
            ("dynres", args.policy),
            ("verl", "dynres:" + args.policy),
            ("dynres", "default"),
            ("verl", "default"),
        )
    ]
    check = validate()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, row in enumerate(pool.map(run_one, jobs), start=1):
            rows.append(row)
            print(f"# {i}/{len(jobs)} {row['scenario']} {row['host']} seed {row['seed']}", file=sys.stderr)
    table = summarise(rows, names, args.policy)
    print_report(check, table, args.policy, args.seeds, args.verl_timing)
    if args.json:
        Path(args.json).write_text(json.dumps({"check": check, "rows": rows, "table": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
