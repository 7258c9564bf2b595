"""The switch costs of a fitted scenario: sleep, wake_up, abort, trainer offload and onload.

A switch cost can come from four places, taken in this order (:func:`fit_switch_costs`): the
run's own switches during its cycles, the switches of ``--costs-from``'s cycles, the run's
switch calibration, ``--costs-from``'s switch calibration; else the scenario default, listed as
missing. Switches made during cycles come first because they are what the simulator replays:
made while the standalone replicas generate, with the abort and drain of in-flight requests. The
calibration (``report.json``'s ``switch_calibration``) measures idle switches before the first
cycle, and has no abort; it is what a run that never switched (``static_fully_async``) can tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dynres.runtime.sim.fit.provenance import AnnotatedScenario
from dynres.runtime.sim.fit.stats import mean_spread

SWITCH_OPS: tuple[tuple[str, str], ...] = (
    ("costs.sleep_s", "sleep"),
    ("costs.wake_up_s", "wake_up"),
    ("costs.abort_s", "abort"),
    ("costs.trainer_offload_s", "offload"),
    ("costs.trainer_onload_s", "onload"),
)
"""Scenario cost key and engine operation of each switch step (seconds each)."""

WAKE_UP_CALLS = 2
"""wake_up calls per replica per activation (count): the controller wakes the weights, loads them,
then wakes the KV cache; the scenario's ``wake_up_s`` is both together."""


def op_mean(report: Mapping[str, Any] | None, op: str) -> tuple[float, int] | None:
    """Mean duration (seconds) and count of engine operation ``op`` in a report.json (None = never called)."""
    if not report:
        return None
    st = (report.get("operations") or {}).get("engine", {}).get(op)
    if not st or not st.get("count"):
        return None
    return float(st["total_s"]) / int(st["count"]), int(st["count"])


def fit_switch_costs(
    scenario: AnnotatedScenario,
    report: Mapping[str, Any] | None,
    why_missing: str,
    costs_from: Mapping[str, Any] | None,
    costs_source: str,
) -> None:
    """Each switch cost from the first of: ``report``'s cycle switches, ``costs_from``'s, ``report``'s
    switch calibration, ``costs_from``'s; else the default, named as missing with ``why_missing``
    (``{op}`` is the operation). ``report`` None: the format has no report.json at all."""
    for key, op in SWITCH_OPS:
        own, other = _ops_cost(report, op), _ops_cost(costs_from, op)
        own_cal, other_cal = _calibration_values(report, op), _calibration_values(costs_from, op)
        if own:
            scenario.set(key, round(own[0], 6), f"[M] report.json {own[1]}")
        elif other:
            scenario.set(key, round(other[0], 6), f"[M] {costs_source} {other[1]} (--costs-from)")
        elif own_cal:
            scenario.set(key, round(mean_spread(own_cal)[0], 6), _calibration_note(own_cal, op, "report.json"))
        elif other_cal:
            note = _calibration_note(other_cal, op, costs_source)
            scenario.set(key, round(mean_spread(other_cal)[0], 6), note + " (--costs-from)")
        else:
            why = why_missing.format(op=op)
            if op != "abort" and report is not None and not (report or {}).get("switch_calibration"):
                why += "; no switch calibration (run.calibration_switches: 0, or no hybrid replicas)"
            scenario.default(key, f"{op} timings ({why})")


def _calibration_values(report: Mapping[str, Any] | None, op: str) -> list[float]:
    """One value per calibrated switch of a replica (or of the trainer) for ``op`` from a report's
    ``switch_calibration`` (seconds): wake_up sums a replica's weights and kv_cache calls of a round."""
    calibration = (report or {}).get("switch_calibration")
    if not isinstance(calibration, Mapping):
        return []
    steps = [s for s in calibration.get("steps") or [] if isinstance(s, Mapping) and s.get("ok") and s.get("op") == op]
    if op != "wake_up":
        return [float(s["duration_s"]) for s in steps]
    per: dict[tuple[Any, Any], float] = {}
    for s in steps:
        key = (s.get("round"), s.get("target"))
        per[key] = per.get(key, 0.0) + float(s["duration_s"])
    return list(per.values())


def _calibration_note(values: Sequence[float], op: str, where: str) -> str:
    """The note of a cost taken from a switch calibration: how many values and their spread."""
    what = "replica wake-ups (weights + kv_cache calls)" if op == "wake_up" else f"{op} calls"
    if len(values) < 2:
        spread = "spread unknown (one value; raise run.calibration_switches for more)"
    else:
        spread = f"spread {mean_spread(values)[1] * 100:.0f}%, max {max(values):.3g} s"
    return f"[M] {where} switch calibration (idle switch before cycle 1), mean of n={len(values)} {what}, {spread}"


def _ops_cost(report: Mapping[str, Any] | None, op: str) -> tuple[float, str] | None:
    """Mean cost of ``op`` per switch from a report's cycle operations, and how it was counted."""
    got = op_mean(report, op)
    if not got:
        return None
    mean, count = got
    st = report["operations"]["engine"][op] if report else {}
    tail = f"n={count} calls, max {float(st.get('max_s') or 0.0):.3g} s"
    if op == "wake_up":
        return mean * WAKE_UP_CALLS, f"{WAKE_UP_CALLS} x mean wake_up call (weights, then kv_cache), {tail}"
    return mean, f"{op} mean, {tail}"
