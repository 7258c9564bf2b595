"""Every built-in policy on every simulator preset: end-to-end time, ratio to the bound, regret.

    .venv/bin/python benchmarks/policy_bench.py [--seeds N] [--jobs J] [--scenario NAME ...]
        [--policies default,static_fully_async,fixed_ratio,predictive] [--json FILE] [--headroom]
        [--sample N --sample-seed S [--sample-steps C]]

Each preset runs with dynamic scheduling switched on (``use_dynamic_resource_scheduling:
true``), so that a static preset is the same cluster with hybrid replicas available; presets
that are then identical to an earlier one (a static baseline of a dynamic preset) are run once.
Every (scenario, policy) pair runs with seeds ``0 .. N-1`` (response lengths, routing ties), the
same seeds for every policy, and the table shows the mean. Per scenario and policy it prints:

* ``mean h`` and ``spread``: mean end-to-end time over the seeds (hours) and max - min (%);
* ``/bound``: mean end-to-end / mean tight lower bound (``lower_bound_s``);
* ``regret``: mean end-to-end / the better mean of ``default`` and ``static_fully_async``, - 1;
* ``sw``: mean hybrid switches (activations + deactivations);
* ``target``: PASS when ``predictive``'s regret is at most +1% on that scenario, else FAIL.

Then the geometric means over scenarios of each policy's time relative to ``default`` and to
``static_fully_async``, and whether ``predictive`` met its targets: at most 1.01 x min(default,
static_fully_async) on every scenario, geomean predictive / default <= 0.97, one PASS/FAIL line
each. Nothing here is a test; the numbers are for reading.

A policy in ``--policies`` may carry params, ``NAME[KEY=VALUE;KEY=VALUE]`` (values read as YAML
scalars), which run as ``async_training.dynamic_schedule_policy_params``; each such entry is its
own column; every entry is built once before any run, so a bad name or param stops the script at
once. ``--headroom`` adds, per scenario, the best mean of every configuration run, chosen in
hindsight, and that choice's geomean against ``default``: what a policy able to pick the best of
those configurations for each scenario in advance would reach (no single policy does).

``--sample N --sample-seed S`` runs over N scenarios drawn by ``dynres scenario sample --seed S``
(``dynres.runtime.sim.sampling``) instead of the presets; ``--sample-steps C`` runs the same
workloads for C sync cycles instead of the sampler's 20. Tune on the development draws
(``--sample-seed 1``); report on the reporting draws (``--sample-seed 1000``), which no change to a
policy may be tuned on (docs/simulator.md). The last line is the summary

    geomean_vs_default=<f> hindsight_geomean_vs_default=<f> worst_regret_pct=<f> over_1pct=<int> scenarios=<int>

``predictive``'s geomean against ``default``, the hindsight best's (over every configuration run),
its worst regret in percent and the scenarios where its regret exceeds +1%. ``--judge ENTRY`` puts
another ``--policies`` entry (e.g. ``predictive[extra_admission=0.5]``) in ``predictive``'s place
for the targets and that line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

POLICIES = ("default", "static_fully_async", "fixed_ratio", "predictive")
DYNAMIC_ON = {"async_training.use_dynamic_resource_scheduling": True}
REGRET_LIMIT = 1.01
GEOMEAN_LIMIT = 0.97


def scenarios(names: list[str] | None) -> list[str]:
    """The presets to run, without ones identical (dynamic on, policy aside) to an earlier one."""
    from dynres.runtime.sim.presets import preset_names
    from dynres.runtime.sim.scenario import load_scenario

    chosen = names or preset_names()
    seen: dict[str, str] = {}
    out = []
    for name in chosen:
        sc = load_scenario(name, overrides=DYNAMIC_ON)
        key = sc.model_dump(exclude={"name": True, "description": True, "async_training": {"dynamic_schedule_policy"}})
        text = json.dumps(key, sort_keys=True)
        if text in seen and not names:
            print(f"# {name}: same run as {seen[text]} with dynamic scheduling on; skipped", file=sys.stderr)
            continue
        seen[text] = name
        out.append(name)
    return out


def add_scenario_args(ap: argparse.ArgumentParser) -> None:
    """The options that choose what runs: presets (``--scenario``) or a draw (``--sample``...)."""
    ap.add_argument("--scenario", action="append", help="preset or scenario file (default: every preset)")
    ap.add_argument("--sample", type=int, metavar="N", help="run N drawn scenarios instead of the presets")
    ap.add_argument(
        "--sample-seed", type=int, metavar="S", help="the draw's seed (1: development draws, 1000: reporting draws)"
    )
    ap.add_argument(
        "--sample-steps",
        type=int,
        metavar="C",
        help="sync cycles of each drawn scenario (default: the sampler's 20); the workloads stay the seed's",
    )


def check_scenario_args(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """Refuse a combination of add_scenario_args' options that does not name one set of scenarios."""
    if (args.sample is None) != (args.sample_seed is None):
        ap.error("--sample N and --sample-seed S go together")
    if args.sample is not None and args.scenario:
        ap.error("--sample replaces the presets; give it or --scenario, not both")
    if args.sample_steps is not None and args.sample is None:
        ap.error("--sample-steps sets the run length of drawn scenarios; give --sample N --sample-seed S too")
    if args.sample_steps is not None and args.sample_steps < 1:
        ap.error(f"--sample-steps must be >= 1 sync cycles, got {args.sample_steps}")


def chosen_scenarios(args: argparse.Namespace) -> list[str | dict[str, Any]]:
    """The presets or files to run, or the drawn scenario mappings, as add_scenario_args chose."""
    if args.sample is None:
        return list(scenarios(args.scenario))
    from dynres.runtime.sim.sampling import STEPS, sample_scenarios

    steps = STEPS if args.sample_steps is None else args.sample_steps
    return [sc for sc, _ in sample_scenarios(args.sample_seed, args.sample, steps)]


def parse_policy(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME[KEY=VALUE;...]`` -> (policy name, params with YAML-scalar values)."""
    from dynres.core.config import parse_set_item
    from dynres.core.errors import ConfigError

    m = re.fullmatch(r"\s*([^\[\]\s]+)\s*(?:\[(.*)\])?\s*", spec)
    if not m:
        raise SystemExit(f"policy_bench: policy {spec!r} is not NAME or NAME[KEY=VALUE;...]")
    params: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in (m.group(2) or "").split(";"))):
        try:
            key, value = parse_set_item(item)  # the same KEY=VALUE reading as --set
        except ConfigError as exc:
            raise SystemExit(f"policy_bench: param {item!r} of {spec!r} is not KEY=VALUE ({exc})") from None
        params[key] = value
    return m.group(1), params


def check_policy(spec: str) -> None:
    """Build the policy of ``spec`` once, so that an unknown name or param is refused up front."""
    from dynres.core.errors import DynresError
    from dynres.core.loading import load_policy

    name, params = parse_policy(spec)
    try:
        load_policy(name, params)
    except DynresError as exc:
        raise SystemExit(f"policy_bench: policy {spec!r}: {exc}") from None


def run_one(job: tuple[str | dict[str, Any], str, int]) -> dict[str, Any]:
    """Simulate one (scenario: a name, file or drawn mapping; policy spec; seed); return its headline numbers."""
    from dynres.runtime.sim import simulate

    scenario, spec, seed = job
    policy, params = parse_policy(spec)
    overrides = dict(DYNAMIC_ON)
    overrides.update({f"async_training.dynamic_schedule_policy_params.{k}": v for k, v in params.items()})
    r = simulate(scenario, policy=policy, seed=seed, overrides=overrides)
    return {
        "scenario": scenario["name"] if isinstance(scenario, dict) else scenario,
        "policy": spec,
        "seed": seed,
        "end_to_end_s": r.end_to_end_s,
        "lower_bound_s": r.lower_bound_s,
        "lower_bound_naive_s": getattr(r, "lower_bound_naive_s", r.lower_bound_s),
        "switches": r.switches,
    }


def summarise(rows: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """Mean, spread, ratio to the bound and regret per scenario and policy; geomeans."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        table[sc] = {}
        for pol in policies:
            mine = [r for r in rows if r["scenario"] == sc and r["policy"] == pol]
            e2e = [r["end_to_end_s"] for r in mine]
            mean = statistics.fmean(e2e)
            table[sc][pol] = {
                "mean_s": mean,
                "spread": (max(e2e) - min(e2e)) / mean,
                "bound_s": statistics.fmean(r["lower_bound_s"] for r in mine),
                "naive_bound_s": statistics.fmean(r["lower_bound_naive_s"] for r in mine),
                "switches": statistics.fmean(r["switches"] for r in mine),
            }
        base = [table[sc][p]["mean_s"] for p in ("default", "static_fully_async") if p in table[sc]]
        best = min(base) if base else math.nan
        for pol in policies:
            t = table[sc][pol]
            t["ratio_to_bound"] = t["mean_s"] / t["bound_s"]
            t["regret"] = t["mean_s"] / best - 1.0
    geo: dict[str, dict[str, float]] = {}
    for ref in ("default", "static_fully_async"):
        if ref not in policies:
            continue
        geo[ref] = {
            pol: math.exp(
                statistics.fmean(math.log(table[sc][pol]["mean_s"] / table[sc][ref]["mean_s"]) for sc in table)
            )
            for pol in policies
        }
    return {"table": table, "geomean_vs": geo}


def headroom(summary: dict[str, Any], policies: list[str]) -> dict[str, Any]:
    """Per scenario the configuration with the best mean, chosen in hindsight; its geomean vs default."""
    table = summary["table"]
    best = {sc: min(policies, key=lambda pol: row[pol]["mean_s"]) for sc, row in table.items()}
    geo = math.nan
    if "default" in policies:
        ratios = [table[sc][pol]["mean_s"] / table[sc]["default"]["mean_s"] for sc, pol in best.items()]
        geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
    return {"best": best, "geomean_vs_default": geo, "configurations": len(policies)}


def print_headroom(summary: dict[str, Any], room: dict[str, Any]) -> None:
    """One line per scenario: the hindsight-best configuration and its mean against default's."""
    table = summary["table"]
    print(f"hindsight best of {room['configurations']} configurations per scenario:")
    for sc, pol in room["best"].items():
        row = table[sc]
        vs = f"{row[pol]['mean_s'] / row['default']['mean_s']:.4f} x default" if "default" in row else ""
        print(f"  {sc:<24} {row[pol]['mean_s'] / 3600:7.3f}h {vs}  {pol}")
    print(f"geomean of the hindsight best vs default: {room['geomean_vs_default']:.4f}")


def print_report(summary: dict[str, Any], policies: list[str], seeds: int, judge: str = "predictive") -> None:
    """The table, the geomeans and the targets of the judged column (``predictive`` unless ``--judge``)."""
    table = summary["table"]
    print(f"seeds per run: {seeds}; regret = mean / min(default, static_fully_async) - 1")
    head = f"{'scenario':<24} {'bound h':>8} {'naive h':>8}"
    for pol in policies:
        head += f" | {pol[:18]:>18} {'/bound':>6} {'regret':>7} {'sw':>5}"
    judged = judge in policies and "default" in policies and "static_fully_async" in policies
    if judged:
        head += f" | {'target':>6}"
    print(head)
    print("-" * len(head))
    for sc, row in table.items():
        first = row[policies[0]]
        line = f"{sc:<24} {first['bound_s'] / 3600:8.3f} {first['naive_bound_s'] / 3600:8.3f}"
        for pol in policies:
            t = row[pol]
            cell = f"{t['mean_s'] / 3600:.3f}h±{t['spread'] * 100:.1f}%"
            line += f" | {cell:>18} {t['ratio_to_bound']:6.3f} {t['regret'] * 100:+6.1f}% {t['switches']:5.0f}"
        if judged:
            line += f" | {'PASS' if row[judge]['regret'] <= REGRET_LIMIT - 1.0 else 'FAIL':>6}"
        print(line)
    for ref, geo in summary["geomean_vs"].items():
        print(f"geomean vs {ref}: " + ", ".join(f"{p} {v:.4f}" for p, v in geo.items()))
    if judge in policies and "default" in summary["geomean_vs"]:
        worst = max(table.items(), key=lambda kv: kv[1][judge]["regret"])
        geo = summary["geomean_vs"]["default"][judge]
        ok_regret = worst[1][judge]["regret"] <= REGRET_LIMIT - 1.0
        failed = sum(row[judge]["regret"] > REGRET_LIMIT - 1.0 for row in table.values())
        print(
            f"target regret <= {(REGRET_LIMIT - 1) * 100:+.0f}% on every scenario: {'PASS' if ok_regret else 'FAIL'} "
            f"(worst {worst[1][judge]['regret'] * 100:+.2f}% on {worst[0]}; {failed} of {len(table)} over)"
        )
        print(
            f"target geomean {judge} / default <= {GEOMEAN_LIMIT}: "
            f"{'PASS' if geo <= GEOMEAN_LIMIT else 'FAIL'} ({geo:.4f})"
        )


def summary_line(summary: dict[str, Any], policies: list[str], judge: str = "predictive") -> str:
    """The closing key=value line: the judged column's geomean and regrets, the hindsight best's geomean."""
    table = summary["table"]
    room = headroom(summary, policies)
    geo = summary["geomean_vs"].get("default", {}).get(judge, math.nan)
    regrets = [row[judge]["regret"] for row in table.values()] if judge in policies else [math.nan]
    over = sum(r > REGRET_LIMIT - 1.0 for r in regrets)
    return (
        f"geomean_vs_default={geo:.4f} hindsight_geomean_vs_default={room['geomean_vs_default']:.4f} "
        f"worst_regret_pct={max(regrets) * 100:.3f} over_1pct={over} scenarios={len(table)}"
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run everything, print the report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per (scenario, policy), 0 .. N-1 (default 3)")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in parallel processes (default 1)")
    add_scenario_args(ap)
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated policies, each NAME or NAME[KEY=VALUE;...] (params of that policy)",
    )
    ap.add_argument(
        "--headroom", action="store_true", help="also print the best configuration per scenario, chosen in hindsight"
    )
    ap.add_argument(
        "--judge",
        metavar="POLICY",
        help="the --policies entry the targets and the summary line judge (default predictive)",
    )
    ap.add_argument("--json", help="also write the per-run rows and the summary to this file")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        ap.error("--seeds and --jobs must be >= 1")
    check_scenario_args(args, ap)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for pol in policies:
        check_policy(pol)  # a malformed entry, unknown policy or bad param stops here, before any run
    if args.judge is not None and args.judge not in policies:
        ap.error(f"--judge {args.judge!r} is not one of --policies ({', '.join(policies)})")
    judge = args.judge or "predictive"
    names = chosen_scenarios(args)
    jobs = [(sc, pol, seed) for sc in names for pol in policies for seed in range(args.seeds)]
    if args.jobs == 1:
        rows = []
        for job in jobs:
            rows.append(run_one(job))
            print(f"# {rows[-1]['scenario']} {job[1]} seed {job[2]}: {rows[-1]['end_to_end_s']:.0f} s", file=sys.stderr)
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(run_one, jobs))
    summary = summarise(rows, policies)
    print_report(summary, policies, args.seeds, judge)
    if args.headroom:
        summary["headroom"] = headroom(summary, policies)
        print_headroom(summary, summary["headroom"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, **summary}, fh, indent=2)
    print(summary_line(summary, policies, judge))
    return 0


if __name__ == "__main__":
    sys.exit(main())
