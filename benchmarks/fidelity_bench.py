"""Fidelity of the simulator on a real run: fit a scenario to one run, predict others, measure them.

    .venv/bin/python benchmarks/fidelity_bench.py [--config examples/tiny-grpo-cpu.yaml]
        [--steps N] [--repeats K] [--seeds N] [--out DIR] [--predict default,predictive] [--json]
        [--reuse [POLICIES]]

``--reuse`` runs nothing: it reads the runs a previous call left in DIR and predicts again.
``--reuse default`` reads only the named policies' runs (``DIR/rep<k>/<policy>``, left by a
previous call or by ``dynres run --out``) and runs the others: a ``default`` run made for another
purpose saves one engine start-up.

1. Runs the config for real with ``static_fully_async`` (benchmarks/tiny_grpo_bench.run_one),
   ``--repeats`` times. Each run measures one idle switch before its first cycle (the switch
   calibration, ``run.calibration_switches``), so the fit knows the switch costs although the run
   never switches.
2. Fits a scenario to each of those runs (``dynres scenario fit``; the one of the median run is
   written to DIR/fitted.yaml) and predicts the end-to-end time of the run as it was and with
   each ``--predict`` policy (``dynres scenario compare``), with the decisions each prediction
   made (switches). The table shows the prediction from the median static run, and the range
   over the fits of all static runs: how much the answer depends on the run fitted.
3. Runs each ``--predict`` policy for real ``--repeats`` times and prints, per policy: predicted,
   the median measured end-to-end and its run-to-run range, the error against the median, and
   the decisions (activations/deactivations) each run made.
4. For comparison, the prediction with switch costs and hybrid_speed_factor taken from the first
   measured run of the first dynamic policy (``--costs-from``): the part of the error due to what
   a static run cannot tell. The targets judge step 2's prediction.

Targets (printed PASS/FAIL as they are; a missed target is a finding, and the exit status stays
0): the as-it-was prediction within 10% of the median measured static run, the other policies
within 15% of theirs, and the ranking of the three policies the same as measured. The exit
status is non-zero only when something broke (a run failed, an output is missing). Run it on a
quiet machine: the real runs take turns on the same cores.

The ranking is judged pair by pair (:func:`judge_pair`), and the ranking target is the AND of the
pairs. For two policies A and B: the measured order is the order of their median end-to-end
times; the run-to-run range is the larger of the two policies' ranges (max - min over their
runs), unknown with one run per policy; the prediction is a tie when the two predicted times are
within ``TIE`` (1%) of the smaller (the line says whether their decisions, i.e. switches, were
the same). Then:

* predicted tie: PASS only when the measured gap is inside the range ("predicted tie, measured
  gap X s inside range Y s"); FAIL when it exceeds the range, or when the range is unknown (a
  tie cannot be confirmed from one run each);
* predicted order, measured gap inside the range: PASS, said as "measured order is noise"
  (whatever the measured order is, it is not a finding);
* predicted order, gap beyond the range (or range unknown): PASS when the predicted order equals
  the measured order of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

AS_IT_WAS_TARGET = 0.10
"""Largest |error| of the as-it-was prediction that meets the target (fraction)."""
OTHER_TARGET = 0.15
"""Largest |error| of another policy's prediction that meets the target (fraction)."""
FITTED_POLICY = "static_fully_async"
"""The policy of the run the scenario is fitted to."""
TIE = 0.01
"""Two predictions closer than this (relative to the smaller) are a predicted tie (fraction)."""


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def load_run(run_dir: Path) -> dict:
    """The numbers run_one returns, read back from a finished run's report.json (``--reuse``)."""
    rep = json.loads((run_dir / "report.json").read_text())
    ops = rep["operations"]
    return {
        "policy": rep["policy"],
        "end_to_end_s": rep["end_to_end_s"],
        "activations": ops["activations"],
        "deactivations": ops["deactivations"],
    }


def reused_policies(spec: str, policies: list[str], ap: argparse.ArgumentParser) -> set[str]:
    """The policies ``--reuse`` names (``*``: all of them; empty: none); an unknown one stops the bench."""
    if spec == "*":
        return set(policies)
    named = {p.strip() for p in spec.split(",") if p.strip()}
    unknown = sorted(named - set(policies))
    if unknown:
        ap.error(f"--reuse {','.join(unknown)}: not among this call's policies ({', '.join(policies)}); name those")
    return named


def judge_pair(a: dict, b: dict, tie: float = TIE) -> tuple[bool, str]:
    """The ranking verdict on one pair of rows (module text): (PASS?, the line that says why).

    A row needs ``policy``, ``predicted_s``, ``predicted_switches``, ``measured_s`` (median, s)
    and ``measured_runs_s`` (every run's end-to-end, s).
    """
    pa, pb = a["predicted_s"], b["predicted_s"]
    sa, sb = a["predicted_switches"], b["predicted_switches"]
    decisions = f"{'same decisions' if sa == sb else 'different decisions'}, {sa} vs {sb} switches"
    gap = abs(a["measured_s"] - b["measured_s"])
    known = min(len(a["measured_runs_s"]), len(b["measured_runs_s"])) >= 2
    noise = max(max(r["measured_runs_s"]) - min(r["measured_runs_s"]) for r in (a, b))
    if a["measured_s"] == b["measured_s"]:
        measured = "measured equal medians"
    else:
        measured = f"measured {(a if a['measured_s'] < b['measured_s'] else b)['policy']} faster by {gap:.2f} s"
    head = f"{a['policy']} vs {b['policy']}: "
    if abs(pa - pb) <= tie * min(pa, pb):
        pred = f"predicted tie ({decisions}; within {tie:.0%})"
        if not known:
            return False, f"{head}{pred}, {measured}: run-to-run range unknown (one run per policy), tie not confirmed"
        inside = gap <= noise
        where = "inside" if inside else "exceeds"
        return inside, f"{head}{pred}, measured gap {gap:.2f} s {where} range {noise:.2f} s"
    first = a if pa < pb else b
    pred = f"predicted {first['policy']} faster by {abs(pa - pb) / max(pa, pb):.1%} ({decisions})"
    if known and gap <= noise:
        return True, f"{head}{pred}; measured order is noise: gap {gap:.2f} s inside range {noise:.2f} s"
    same = a["measured_s"] != b["measured_s"] and (pa < pb) == (a["measured_s"] < b["measured_s"])
    where = f"exceeds range {noise:.2f} s" if known else "run-to-run range unknown (one run per policy)"
    return same, f"{head}{pred}; {measured}, {where}: {'same order' if same else 'order differs'}"


def judge_ranking(rows: list[dict], tie: float = TIE) -> tuple[bool, list[str]]:
    """The ranking target: the AND of :func:`judge_pair` over every pair of rows, and one line per pair."""
    verdicts = [judge_pair(a, b, tie) for i, a in enumerate(rows) for b in rows[i + 1 :]]
    return all(ok for ok, _ in verdicts), [f"{'PASS' if ok else 'FAIL'}  {line}" for ok, line in verdicts]


def main(argv: list[str] | None = None) -> int:
    """Run, fit, predict, run again; print the table and the targets."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "tiny-grpo-cpu.yaml"))
    ap.add_argument("--steps", type=int, default=None, help="override run.steps (sync cycles)")
    ap.add_argument("--repeats", type=int, default=3, help="real runs per policy (the median is compared)")
    ap.add_argument("--seeds", type=int, default=3, help="workload seeds per prediction")
    ap.add_argument("--out", default="/tmp/dynres-fidelity-bench")
    ap.add_argument("--predict", default="default,predictive", help="policies to predict and then measure")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument(
        "--reuse",
        nargs="?",
        const="*",
        default="",
        metavar="POLICIES",
        help="read the runs left in --out/rep<k>/<policy> instead of running them: every policy's (no value) "
        "or only these (comma-separated)",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give at least 1 real run per policy")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from tiny_grpo_bench import run_one

    from dynres.runtime.sim.fit import check_policies, fit_scenario, predict
    from dynres.runtime.sim.metrics_io import read_metrics, read_report

    others = [p.strip() for p in args.predict.split(",") if p.strip()]
    others = [p for p in others if p != FITTED_POLICY]
    check_policies([FITTED_POLICY, *others])
    out = Path(args.out)
    policies = [FITTED_POLICY, *others]
    reused = reused_policies(args.reuse, policies, ap)
    # Checked before any run starts: a missing folder would otherwise stop the bench after the
    # runs it did start.
    for policy in reused:
        for k in range(args.repeats):
            if not (out / f"rep{k}" / policy / "report.json").is_file():
                ap.error(
                    f"--reuse {policy}: {out / f'rep{k}' / policy / 'report.json'} is missing; run that policy "
                    f"into {out / f'rep{k}' / policy} first (dynres run --out), or drop it from --reuse"
                )
    runs: dict[str, list[dict]] = {p: [] for p in policies}

    def measure(policy: str, k: int) -> None:
        run_dir = out / f"rep{k}" / policy
        if policy in reused:
            runs[policy].append(load_run(run_dir))
            return
        print(f"running {policy} ({k + 1}/{args.repeats}) ...", file=sys.stderr, flush=True)
        runs[policy].append(run_one(args.config, policy, args.steps, out / f"rep{k}"))

    # Interleaved repeats: a slow spell of the machine spreads over every policy, not one.
    for k in range(args.repeats):
        for policy in policies:
            measure(policy, k)
    # The scenario is fitted to every static run; the table's prediction is the one fitted to the
    # median static run (written to fitted.yaml), and the range over all fits shows how much the
    # answer depends on which run was fitted.
    statics = [r["end_to_end_s"] for r in runs[FITTED_POLICY]]
    order = sorted(range(len(statics)), key=lambda k: statics[k])
    mid = order[(len(order) - 1) // 2]
    fits = [fit_scenario(read_metrics(out / f"rep{k}" / FITTED_POLICY / "metrics.jsonl")) for k in range(args.repeats)]
    cmps = [predict(f, others, seeds=args.seeds) for f in fits]
    fit, cmp, fitted_dir = fits[mid], cmps[mid], out / f"rep{mid}" / FITTED_POLICY
    (out / "fitted.yaml").write_text(fit.to_yaml())
    over_fits = {p.policy: [c.predictions[i].mean_s for c in cmps] for i, p in enumerate(cmp.predictions)}

    cal = None
    if others:
        report, src = read_report(out / "rep0" / others[0])
        cal_fit = fit_scenario(read_metrics(fitted_dir / "metrics.jsonl"), costs_from=report, costs_source=src)
        (out / "fitted-costs-from.yaml").write_text(cal_fit.to_yaml())
        cal = {p.policy: p for p in predict(cal_fit, others, seeds=args.seeds).predictions}

    rows = []
    for p in cmp.predictions:
        ms = [r["end_to_end_s"] for r in runs[p.policy]]
        m = median(ms)
        c = cal[p.policy] if cal else None
        rows.append(
            {
                "policy": p.policy,
                "as_it_was": p.as_it_was,
                "predicted_s": p.mean_s,
                "predicted_min_s": min(p.predicted_s),
                "predicted_max_s": max(p.predicted_s),
                "predicted_over_fits_s": over_fits[p.policy],
                "predicted_switches": p.switches,
                "measured_s": m,
                "measured_runs_s": ms,
                "measured_range_s": max(ms) - min(ms),
                "measured_switches": [f"{r['activations']}/{r['deactivations']}" for r in runs[p.policy]],
                "error": (p.mean_s - m) / m,
                "predicted_with_switch_costs_s": c.mean_s if c else None,
                "predicted_switches_with_switch_costs": c.switches if c else None,
                "error_with_switch_costs": (c.mean_s - m) / m if c else None,
            }
        )
    by_pred = [r["policy"] for r in sorted(rows, key=lambda r: r["predicted_s"])]
    by_meas = [r["policy"] for r in sorted(rows, key=lambda r: r["measured_s"])]
    checks = [
        (f"as-it-was ({FITTED_POLICY}) within {AS_IT_WAS_TARGET:.0%}", abs(rows[0]["error"]) <= AS_IT_WAS_TARGET),
        *(
            (f"{r['policy']} within {OTHER_TARGET:.0%}", abs(r["error"]) <= OTHER_TARGET)
            for r in rows
            if not r["as_it_was"]
        ),
    ]
    ranking_ok, pairs = judge_ranking(rows)
    checks.append(("same ranking as measured (every pair, pair rule)", ranking_ok))
    calibration = (read_report(fitted_dir)[0].get("switch_calibration") or {}) if fitted_dir.exists() else {}
    result = {
        "config": args.config,
        "repeats": args.repeats,
        "fitted": str(out / "fitted.yaml"),
        "fitted_run": str(fitted_dir),
        "switch_calibration_s": (calibration["end_s"] - calibration["start_s"]) if calibration else None,
        "warmup_s": cmp.warmup_s,
        "missing": fit.missing,
        "rows": rows,
        "ranking_predicted": by_pred,
        "ranking_measured": by_meas,
        "pairs": pairs,
        "targets": {name: ok for name, ok in checks},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"fitted scenario: {out / 'fitted.yaml'} ({len(fit.missing)} metric(s) missing, defaults used)")
    if calibration:
        print(f"switch calibration of the fitted run: {result['switch_calibration_s']:.2f} s before its first cycle")
    head = (
        f"{'policy':<31} {'predicted s':>11} {'(all fits)':>11} {'sw':>3} {'measured s':>10} {'range':>6} {'error':>7} "
        f"{'w/ --costs-from':>15} {'sw':>3} {'error':>7}  decisions (act/deact per run)"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        label = r["policy"] + (" (as it was)" if r["as_it_was"] else "")
        cal_s = "-" if r["predicted_with_switch_costs_s"] is None else f"{r['predicted_with_switch_costs_s']:.2f}"
        cal_sw = "-" if r["predicted_switches_with_switch_costs"] is None else r["predicted_switches_with_switch_costs"]
        cal_e = "-" if r["error_with_switch_costs"] is None else f"{r['error_with_switch_costs'] * 100:+.1f}%"
        print(
            f"{label:<31} {r['predicted_s']:>11.2f} {_span(r['predicted_over_fits_s']):>11} "
            f"{r['predicted_switches']:>3} {r['measured_s']:>10.2f} "
            f"{r['measured_range_s']:>6.2f} {r['error'] * 100:>+6.1f}% {cal_s:>15} {cal_sw:>3} {cal_e:>7}  "
            f"{' '.join(r['measured_switches'])}"
        )
    print(
        f"measured = median of {args.repeats} run(s) (range = max - min); sw = predicted switches "
        f"(activations + deactivations); start-up not simulated, added to each prediction: {cmp.warmup_s:+.2f} s"
    )
    print(f"predicted from the median static run (rep{mid}); (all fits): from each of the {args.repeats} static runs")
    if cal:
        print(
            f"'w/ --costs-from': switch costs and hybrid_speed_factor (on a shared host: evidence for it) "
            f"from {others[0]}'s first measured run"
        )
    print(f"ranking predicted: {' < '.join(by_pred)}")
    print(f"ranking measured:  {' < '.join(by_meas)}")
    for line in pairs:
        print(f"  {line}")
    for name, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
