"""The replica model of a fitted scenario: peak decode speed, the hybrid replica's share of it,
and whether all engines share one host.

A run records its cycles' total generation, not each replica's, so one unknown per run can be
fitted from it: the per-replica peak speed (:func:`fit_peak`), hybrid and standalone replicas
pooled. The hybrid replica's relative speed needs a second run whose hybrids generated
(``--costs-from``, :func:`fit_hybrid_speed`). On one machine's CPU cores every engine shares the
same compute, so a woken hybrid adds none (:func:`fit_shared_host`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dynres.runtime.hosts import host_facts
from dynres.runtime.sim.fit.formats import cycle_work, record_of
from dynres.runtime.sim.fit.provenance import AnnotatedScenario, yaml_scalar
from dynres.runtime.sim.fit.stats import spread_note
from dynres.runtime.sim.scenario import Scenario

HYBRID_FACTOR_MIN = 0.05
"""Smallest hybrid_speed_factor the fit writes (fraction): the scenario needs > 0, and a solved
factor at or below 0 means the hybrid replica added nothing measurable."""


def fit_peak(
    scenario: AnnotatedScenario, work: Sequence[float], replica_time: Sequence[float], how: str, concurrency: float
) -> float:
    """decode.peak_tokens_per_s from work (decode tokens) over replica time (replica-seconds) per
    cycle, measured at ``concurrency`` requests per replica; returns it.

    The workload's speed curve is ``tput(c) = peak * c / (c + c_half)``, so the peak is the
    measured throughput times ``(c + c_half) / c``; ``lone_request_fraction`` keeps its default
    (a run at one concurrency cannot identify it)."""
    pairs = [(w, t) for w, t in zip(work, replica_time, strict=True) if t > 0 and w > 0]
    if not pairs:
        return float(scenario.default("workload.decode.peak_tokens_per_s", "generation work and time"))
    tput = sum(w for w, _ in pairs) / sum(t for _, t in pairs)
    ch = Scenario().workload.decode.c_half
    peak = tput * (concurrency + ch) / concurrency
    per_cycle = [w / t for w, t in pairs]
    scenario.set(
        "workload.decode.peak_tokens_per_s",
        round(peak, 3),
        f"[D] {tput:.4g} tok/s per replica at c={concurrency:g} requests ({how}; {spread_note(per_cycle)}) "
        "x (c + c_half)/c",
    )
    return peak


def fit_hybrid_speed(
    scenario: AnnotatedScenario,
    sc: Scenario,
    peak: float,
    prefill: float,
    own_hybrid_generated: bool,
    costs_from: Mapping[str, Any] | None,
    costs_source: str,
) -> float | None:
    """workload.decode.hybrid_speed_factor from ``costs_from``'s cycles with hybrid replicas
    generating; returns the solved factor before clamping (None = not solved).

    With this run's per-replica speed ``tput`` at the rollouter's concurrency, each such cycle's
    work is ``tput x busy x (S + f x H x share)``; ``f`` is solved over those cycles together (least
    squares on the totals). The run's own cycles are not used for it: their throughput is pooled
    into ``peak`` (one unknown per run; per-replica token counts are not recorded).
    """
    key = "workload.decode.hybrid_speed_factor"
    cyc = [record_of(c) for c in (costs_from or {}).get("cycles") or [] if isinstance(c, Mapping)]
    S, H = sc.num_standalone_replicas, sc.num_hybrid_replicas
    c_req = sc.async_training.concurrent_samples_per_replica * sc.responses_per_sample
    tput = peak * c_req / (c_req + sc.workload.decode.c_half)
    work, busy, share = cycle_work(cyc, sc.responses_per_sample, prefill, float(sc.workload.prompt_tokens))
    with_h = [(w, t, h) for w, t, h in zip(work, busy, share, strict=True) if h > 0 and t > 0]
    if H and with_h and tput > 0:
        extra = sum(w / tput - t * S for w, t, _ in with_h)
        denom = sum(t * H * h for _, t, h in with_h)
        f = extra / denom
        per = [(w / tput - t * S) / (t * H * h) for w, t, h in with_h]
        clamp = ""
        if not HYBRID_FACTOR_MIN <= f <= 1.0:
            clamp = f"; solved {f:.3g}, clamped to [{HYBRID_FACTOR_MIN}, 1]"
        scenario.set(
            key,
            round(min(1.0, max(HYBRID_FACTOR_MIN, f)), 4),
            f"[D] {costs_source} (--costs-from) cycles with hybrids generating: work / ({tput:.4g} tok/s "
            f"per replica of this run) = busy x ({S} + f x {H} x share), n={len(per)} cycles, "
            f"per-cycle f {min(per):.2g}..{max(per):.2g}{clamp}",
        )
        return f
    if own_hybrid_generated:
        scenario.default(key, "a separate hybrid-replica throughput (the fit pools all replicas; give --costs-from)")
    else:
        scenario.default(
            key,
            "hybrid-replica throughput (hybrid replicas never generated; give --costs-from a run where they did)",
        )
    return None


def fit_shared_host(
    scenario: AnnotatedScenario,
    rcfg: Mapping[str, Any] | None,
    solved_hybrid: float | None,
    without_facts: tuple[bool, str] | None,
) -> None:
    """cluster.shared_host from the run config's engines and device, and from a solved hybrid factor <= 0.

    ``without_facts``: the value and reason when the config tells nothing (the format's own
    knowledge); None leaves the default, listed as missing. On a shared host the hybrid replica
    is the same engine on the same cores as a standalone one, so hybrid_speed_factor (its share
    of the host) is 1; the --costs-from solve, which assumes the hybrid adds its own capacity,
    does not apply there and is only quoted.
    """
    key = "cluster.shared_host"
    facts: tuple[bool | None, str] = host_facts(rcfg, show=yaml_scalar) if rcfg else (None, "")
    if without_facts is not None and facts[0] is None:
        facts = without_facts
    shared, note = _host_verdict(facts, solved_hybrid)
    if shared is None:
        scenario.default(key, "the engines' device (config.json engines and ray slots)")
        return
    scenario.set(key, shared, note)
    if shared:
        negative = solved_hybrid is not None and solved_hybrid <= 0
        solved = f"; --costs-from solved {solved_hybrid:.3g} for an added replica, not applicable" if negative else ""
        scenario.set(
            "workload.decode.hybrid_speed_factor",
            1.0,
            f"[E] shared host: the hybrid replica is the same engine on the same cores, an equal share{solved}",
        )
        scenario.unlist("workload.decode.hybrid_speed_factor")


def _host_verdict(facts: tuple[bool | None, str], solved_hybrid: float | None) -> tuple[bool | None, str]:
    """shared_host and its note from the config ``facts`` and a solved hybrid factor: a factor <= 0
    decides an unknown host (shared) and is quoted against a host known to be separate."""
    negative = solved_hybrid is not None and solved_hybrid <= 0
    evidence = (
        f"--costs-from's solved hybrid_speed_factor {solved_hybrid:.3g} <= 0: the woken hybrid replica added no "
        "throughput"
        if negative
        else ""
    )
    shared, conflict = facts[0], ""
    if shared is None and negative:
        shared = True
    elif shared is False and negative:
        conflict = f"; but {evidence} (contention the simulator does not model)"
    if shared is None:
        return None, ""
    if facts[0] is True:
        note = f"[E] from config.json facts: {facts[1]}; all engines share its cores" + (
            f"; [D] {evidence}" if negative else ""
        )
    elif facts[0] is None:
        note = f"[D] {evidence}" + (f" ({facts[1]})" if facts[1] else "")
    else:
        note = f"[E] from run config facts: {facts[1]}: each replica computes on its own{conflict}"
    return shared, note
