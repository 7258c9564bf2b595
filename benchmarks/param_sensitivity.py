"""How much a policy's result moves when one of its constants moves: a one-at-a-time sweep.

    .venv/bin/python benchmarks/param_sensitivity.py [--policy predictive] [--param NAME ...]
        [--factors 0.5,2] [--seeds N] [--jobs J] [--sample N --sample-seed S [--sample-steps C] | --scenario NAME ...]
        [--json FILE]

Every numeric param of the policy whose default is not 0 runs at its default times each factor
(clamped to the param's bounds, rounded for an integer), every boolean param flipped, one param
at a time, the rest at their defaults. A param whose default is 0 is a switch, not a scale, and is
listed as not swept. A variant the policy refuses (a bound between two params) is listed with the
reason and not run. ``default``, ``static_fully_async`` and the policy at its defaults run beside
the variants, on the same scenarios and seeds (``benchmarks/policy_bench.py``'s runs and
summaries, so the figures read as that bench's).

Per variant it prints the geomean against ``default``, its change from the policy at its
defaults in percent, the worst regret (against min(``default``, ``static_fully_async``)), the
scenarios over +1% regret, and how many scenarios ran more than 0.5% faster or slower than at the
defaults. Per param, the sensitivity: the largest geomean change of its variants, and the most
scenarios one of them changed (a geomean can stay put while runs move both ways). Tune on the
development draws (``--sample 60 --sample-seed 1``), never on the reporting draws
(docs/simulator.md). Progress goes to stderr. Nothing here is a test; the numbers are for reading.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import policy_bench as pb  # a sibling script, not a package

BASELINES = ("default", "static_fully_async")
CHANGED = 0.005
"""A scenario counts as changed when its mean moves more than this share (fraction)."""


def variants(
    policy: str, factors: list[float], only: list[str] | None = None
) -> tuple[list[tuple[str, str]], list[str]]:
    """(param, policy_bench entry) per variant, and one line per param left out with its reason."""
    from dynres.core.errors import DynresError
    from dynres.core.loading import load_policy

    try:
        fields = type(load_policy(policy, {}).params).model_fields
    except (DynresError, AttributeError) as exc:
        raise SystemExit(f"param_sensitivity: policy {policy!r} has no params to sweep ({exc})") from None
    unknown = [name for name in only or [] if name not in fields]
    if unknown:
        raise SystemExit(
            f"param_sensitivity: {policy!r} has no param {', '.join(map(repr, unknown))}; "
            f"its params: {', '.join(fields)}"
        )
    out: list[tuple[str, str]] = []
    skipped: list[str] = []
    for name, field in fields.items():
        if only and name not in only:
            continue
        default = field.default
        if isinstance(default, bool):
            values: list[Any] = [not default]
        elif isinstance(default, (int, float)):
            if default == 0:
                skipped.append(f"{name}: default 0, a switch rather than a scale (not swept)")
                continue
            values = sorted({scaled(default, f, field.metadata) for f in factors} - {default})
        else:
            skipped.append(f"{name}: not a number or a boolean (not swept)")
            continue
        for value in values:
            entry = f"{policy}[{name}={json.dumps(value)}]"
            try:
                load_policy(policy, {name: value})
            except DynresError as exc:
                skipped.append(f"{name}={value}: refused by the policy ({str(exc).splitlines()[0]})")
                continue
            out.append((name, entry))
    return out, skipped


def scaled(default: float, factor: float, bounds: list[Any]) -> float:
    """``default x factor`` within the field's ge/le bounds (6 significant digits); an integer stays one.

    A value past a gt/lt bound is left for the policy to refuse, which lists the variant as refused.
    """
    value = default * factor
    for b in bounds:
        lo = getattr(b, "ge", None)
        hi = getattr(b, "le", None)
        if lo is not None:
            value = max(value, lo)
        if hi is not None:
            value = min(value, hi)
    if isinstance(default, int):
        # A count scaled down stays a count: 0 often means "off", which is not a smaller count.
        return max(round(value), 1 if default >= 1 else 0)
    return float(f"{value:.6g}")  # 0.2 x 0.1 would otherwise name its entry 0.020000000000000004


def run_all(jobs: list[tuple[Any, str, int]], workers: int) -> list[dict[str, Any]]:
    """policy_bench's run_one over every job, with a progress line on stderr about every 5%."""
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    every = max(1, len(jobs) // 20)
    with ProcessPoolExecutor(workers) as pool:
        for fut in as_completed([pool.submit(pb.run_one, job) for job in jobs]):
            rows.append(fut.result())
            done = len(rows)
            if done % every == 0 or done == len(jobs):
                spent = time.monotonic() - start
                eta = spent / done * (len(jobs) - done)
                print(f"# {done}/{len(jobs)} runs, {spent:.0f} s, about {eta:.0f} s left", file=sys.stderr, flush=True)
    return rows


def report(summary: dict[str, Any], base: str, swept: list[tuple[str, str]], skipped: list[str]) -> dict[str, Any]:
    """Print the per-variant table and the per-param sensitivity; return both for --json."""
    table = summary["table"]
    geo = summary["geomean_vs"]["default"]
    entries = [base] + [entry for _, entry in swept]
    lines: dict[str, dict[str, Any]] = {}
    for entry in entries:
        regrets = [row[entry]["regret"] for row in table.values()]
        faster = sum(row[entry]["mean_s"] < row[base]["mean_s"] * (1 - CHANGED) for row in table.values())
        slower = sum(row[entry]["mean_s"] > row[base]["mean_s"] * (1 + CHANGED) for row in table.values())
        lines[entry] = {
            "geomean_vs_default": geo[entry],
            "change_pct": (geo[entry] / geo[base] - 1) * 100,
            "worst_regret_pct": max(regrets) * 100,
            "over_1pct": sum(r > pb.REGRET_LIMIT - 1.0 for r in regrets),
            "faster": faster,
            "slower": slower,
        }
    print(f"{len(table)} scenarios; changed = mean more than {CHANGED * 100:.1f}% faster/slower than {base}")
    head = f"{'variant':<52} {'geomean':>8} {'change':>8} {'worst':>8} {'over1%':>6} {'faster':>6} {'slower':>6}"
    print(head)
    print("-" * len(head))
    for entry, v in lines.items():
        print(
            f"{entry:<52} {v['geomean_vs_default']:8.4f} {v['change_pct']:+7.2f}% {v['worst_regret_pct']:+7.2f}% "
            f"{v['over_1pct']:6d} {v['faster']:6d} {v['slower']:6d}"
        )
    sensitivity: dict[str, float] = {}
    changed: dict[str, int] = {}
    for name, entry in swept:
        sensitivity[name] = max(sensitivity.get(name, 0.0), abs(lines[entry]["change_pct"]))
        # A geomean can stay put while runs move both ways (a rule that helps some and hurts others).
        changed[name] = max(changed.get(name, 0), lines[entry]["faster"] + lines[entry]["slower"])
    print("sensitivity (largest geomean change of a param's variants; most scenarios one of them changed):")
    for name, pct in sorted(sensitivity.items(), key=lambda kv: (-kv[1], -changed[kv[0]])):
        print(f"  {name:<28} {pct:6.2f}%  {changed[name]:4d} of {len(table)} scenarios changed")
    for line in skipped:
        print(f"  not swept: {line}")
    return {"variants": lines, "sensitivity_pct": sensitivity, "changed_scenarios": changed, "not_swept": skipped}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, check every variant, run them all, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="predictive", help="the policy whose params are swept (default predictive)")
    ap.add_argument("--param", action="append", help="sweep only this param (repeatable; default: every one)")
    ap.add_argument("--factors", default="0.5,2", help="comma-separated multiples of each default (default 0.5,2)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per (scenario, variant), 0 .. N-1 (default 1)")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in parallel processes (default 1)")
    pb.add_scenario_args(ap)
    ap.add_argument("--json", help="also write the per-run rows and the figures to this file")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        ap.error("--seeds and --jobs must be >= 1")
    pb.check_scenario_args(args, ap)
    try:
        factors = [float(f) for f in args.factors.split(",") if f.strip()]
    except ValueError:
        ap.error(f"--factors {args.factors!r} is not a comma-separated list of numbers, e.g. 0.5,2")
    if not factors or any(f <= 0 or not math.isfinite(f) or f == 1 for f in factors):
        ap.error(f"--factors {args.factors!r}: give positive multiples other than 1, e.g. 0.5,2")
    pb.check_policy(args.policy)
    swept, skipped = variants(args.policy, factors, args.param)
    if not swept:
        ap.error(f"nothing to sweep for {args.policy!r}: " + "; ".join(skipped))
    names = pb.chosen_scenarios(args)
    entries = [*BASELINES, args.policy] + [entry for _, entry in swept]
    jobs = [(sc, entry, seed) for sc in names for entry in entries for seed in range(args.seeds)]
    size = f"{len(names)} scenarios x {args.seeds} seeds: {len(jobs)} runs"
    print(f"# {len(swept)} variants and {len(BASELINES) + 1} references over {size}", file=sys.stderr)
    rows = run_all(jobs, args.jobs)
    summary = pb.summarise(rows, entries)
    figures = report(summary, args.policy, swept, skipped)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, **figures}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
