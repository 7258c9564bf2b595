"""Where the time goes: a simulated run's gap to the tight lower bound, split into causes.

The gap is ``G = E - LB``: the simulated end-to-end time ``E`` (``SimResult.end_to_end_s``) minus
the tight lower bound ``LB`` (``SimResult.lower_bound_s``, :mod:`dynres.runtime.sim.bound`).
:func:`gap_causes` splits it into the causes of :data:`CAUSES`, in seconds, which add up to ``G``
exactly (to float rounding): every cause but one is measured, the last takes the remainder.

**The trainer's timeline.** The trainer decides when training ends, so ``E`` is read on its
timeline. While the run goes, :class:`TrainerTrace` records, in run-clock seconds, every fit step
(the train engine's ``train_step``), every weight export, every load of weights into the
standalone replicas, the trainer's offloads and onloads, and the controller's state timeline
(``RunReport.timeline``). Each instant of ``[0, E]`` is then given to the first of these that
covers it:

1. *fit*: a fit step runs. Their total ``F`` is the trainer's compute ``T``, which the bound
   already holds (``LB >= T``, its ``train_serial`` term).
2. ``switch``: the controller is ACTIVATING, DEACTIVATING or REBALANCING, or the trainer offloads
   or onloads. The trainer loop awaits every activation, deactivation and rebalance, so all of it
   is on the trainer's path.
3. ``sync``: the trainer exports weights or the standalone replicas load them (the trainer loop
   awaits both). Without partial rollout a sync also waits between the export and the load for
   the running requests to finish (the drain): that instant is the tail of in-flight work and
   goes to ``tail``.
4. ``hybrid_trainer``: the trainer waits while its GPUs are lent to the hybrid replicas (the
   controller is HYBRID_ACTIVE) although the batch of its next fit step is complete (from that
   batch's last ``finished_s`` to the fit step's start): the policy keeps the hybrids generating
   (a deactivation waiting for a queue size above one batch) instead of training. Hybrid time
   before the batch is complete is waiting for samples, and goes to 5. or 6.
5. ``tail``: the trainer waits for the last sample of the batch it is about to train on, after
   every other sample of that batch has arrived (from the second-last ``finished_s`` of the batch
   to the last one), or in a drain (3.).
6. Whatever remains of ``[0, E]`` is other waiting ``R = E - F - switch - sync - hybrid_trainer -
   tail`` (computed as that difference, so the sum is exact). Part of it is ``lost_work``:
   generation work thrown away, which is the work served to the requests of stale-dropped samples
   plus the work served to trained samples beyond what they needed (re-prefill after an abort
   with partial rollout, a restart without it), in tokens (``extra["lost_work_tokens"]``). It is
   made seconds at the run's own mean generation rate (``E x lost / served work``), and at most
   ``R``: lost work only delays training through the trainer's waiting. The rest of ``R`` is
   ``imbalance``: waiting while the replicas, taken together, generated slower than the bound's
   perfectly balanced machine (load spread unevenly, replicas idle, work left at the run's end).
   It is the remainder because it has no direct probe: it is what the other causes leave.

**The bound's credit.** ``G = (E - F) - (LB - F)``: the timeline above splits ``E - F``; the
credit ``C = LB - F >= 0`` is what the bound grants beyond training: waiting for generation no
schedule avoids (the first batch, each cycle's window, their critical paths), and the syncs and
switches the tight terms count. It is taken from the causes a group at a time in the order of
:data:`CREDIT_ORDER`, each cause down to 0 at most, within a group in proportion to its seconds
(which instants of a wait were the unavoidable ones is not knowable, so each keeps the same
share):

1. ``tail`` and ``imbalance``: the trainer waiting for samples, which is what the bound's
   generation terms are about;
2. ``hybrid_trainer``: when the credit exceeds that waiting, the bound holds more generation
   unavoidable than the trainer waited for, so the run generated during other trainer time;
   the hybrids' generation while the trainer waited is what ``whole_run`` and ``per_cycle``
   credit next;
3. ``sync``, then ``switch``: the tight terms count every sync but only the fewest switches;
4. ``lost_work`` last: the bound counts only consumed work and never credits work thrown away.

So no cause goes negative while ``E >= LB``. Should a run ever beat its bound (a bug, which
test_sim_bound_validity guards against), the credit left over makes ``imbalance`` negative, so
that the sum still holds and the violation shows.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynres.runtime.sim.runner import SimResult

CAUSES: tuple[str, ...] = ("switch", "sync", "hybrid_trainer", "tail", "lost_work", "imbalance")
"""The causes of the gap, in the order tables print them."""
CREDIT_ORDER: tuple[tuple[str, ...], ...] = (
    ("tail", "imbalance"),
    ("hybrid_trainer",),
    ("sync",),
    ("switch",),
    ("lost_work",),
)
"""The order in which the bound's credit is taken from the causes, a group at a time, in proportion
to their seconds within a group (module docstring)."""
SWITCH_STATES = frozenset({"ACTIVATING", "DEACTIVATING", "REBALANCING"})
"""Controller states the trainer spends switching (names of ControllerState)."""
HYBRID_STATE = "HYBRID_ACTIVE"
"""Controller state in which the trainer's GPUs generate as hybrid replicas."""

Interval = tuple[float, float]


@dataclass
class TrainerTrace:
    """What the simulator records on the trainer's timeline for the gap (run-clock seconds).

    Filled in while the run goes by the wrappers of :func:`dynres.runtime.sim.runner.simulate`;
    recording only, nothing it holds is read by the run.
    """

    fit: list[Interval] = field(default_factory=list)
    """Each fit step (start, end)."""
    export: list[Interval] = field(default_factory=list)
    """Each weight export by the trainer (start, end)."""
    standalone_load: list[Interval] = field(default_factory=list)
    """Each weight load into a standalone replica (start, end)."""
    trainer_switch: list[Interval] = field(default_factory=list)
    """Each trainer offload or onload (start, end)."""
    last_two_arrivals: list[Interval] = field(default_factory=list)
    """Per fit step: the second-last and last ``finished_s`` of its batch (run clock already)."""

    def record_fit(self, batch: Sequence[Any], compute_s: float) -> None:
        """One fit step of ``compute_s`` seconds on ``batch`` that ends now (the trainer's hook)."""
        now = asyncio.get_running_loop().time()
        self.fit.append((now - compute_s, now))
        # One entry per fit step (an empty batch, which the loop never trains on, adds no wait).
        arrivals = sorted(float(s.finished_s) for s in batch) or [now - compute_s]
        self.last_two_arrivals.append((arrivals[-2] if len(arrivals) > 1 else -math.inf, arrivals[-1]))

    def trace(self, obj: Any, method: str, into: list[Interval]) -> None:
        """Wrap ``obj.method`` (async) on this one instance so each call's (start, end) goes to ``into``."""
        inner = getattr(obj, method)

        async def traced(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            try:
                return await inner(*args, **kwargs)
            finally:
                into.append((t0, loop.time()))

        setattr(obj, method, traced)

    def on_run_clock(self, start: float) -> TrainerTrace:
        """This trace with the loop times shifted to run-clock seconds (``start`` = the run's start)."""

        def shift(ivs: list[Interval]) -> list[Interval]:
            return [(a - start, b - start) for a, b in ivs]

        return TrainerTrace(
            fit=shift(self.fit),
            export=shift(self.export),
            standalone_load=shift(self.standalone_load),
            trainer_switch=shift(self.trainer_switch),
            last_two_arrivals=list(self.last_two_arrivals),  # finished_s is run-clock already
        )


@dataclass(frozen=True)
class GapCauses:
    """The gap ``end_to_end_s - lower_bound_s`` split into causes (seconds; module docstring)."""

    seconds: dict[str, float]
    """Seconds per cause, keys in CAUSES order; they add up to ``gap_s``."""
    gap_s: float
    """end_to_end_s - lower_bound_s (seconds)."""
    paid: dict[str, float]
    """Seconds per cause before the bound's credit is taken (same keys)."""
    credit_s: float
    """lower_bound_s minus the fit steps' time: what the bound grants beyond training (seconds)."""


def _union(intervals: Iterable[Interval], end: float) -> list[Interval]:
    """Disjoint sorted intervals covering the same instants, clipped to ``[0, end]``."""
    out: list[Interval] = []
    for a, b in sorted((max(0.0, a), min(end, b)) for a, b in intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covers(intervals: list[Interval], starts: list[float], t: float) -> bool:
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and intervals[i][0] <= t < intervals[i][1]


def _state_intervals(timeline: Sequence[Any], states: frozenset[str], end: float) -> list[Interval]:
    """Periods the controller spent in one of ``states`` (from its StateChange list)."""
    out = []
    for i, change in enumerate(timeline):
        if change.new in states:
            until = timeline[i + 1].at_s if i + 1 < len(timeline) else end
            out.append((change.at_s, until))
    return out


def _drains(trace: TrainerTrace) -> list[Interval]:
    """Between each export's end and the next standalone load's start (the drain without partial rollout)."""
    loads = sorted(a for a, _ in trace.standalone_load)
    out = []
    for _, done in trace.export:
        i = bisect.bisect_left(loads, done)
        if i < len(loads):
            out.append((done, loads[i]))
    return out


def _tails(trace: TrainerTrace) -> list[Interval]:
    """Per fit step, from the second-last arrival of its batch (at the earliest the previous fit
    step's end: before that the trainer was not waiting for this batch) to the last one."""
    out = []
    for i, (second, last) in enumerate(trace.last_two_arrivals):
        since = trace.fit[i - 1][1] if i > 0 else 0.0
        out.append((max(second, since), last))
    return out


def _ready(trace: TrainerTrace, end: float) -> list[Interval]:
    """Per fit step, from the last arrival of its batch (it could train from then on) to its start."""
    return _union(((last, fit[0]) for (_, last), fit in zip(trace.last_two_arrivals, trace.fit, strict=True)), end)


def _intersect(xs: list[Interval], ys: list[Interval]) -> list[Interval]:
    """Instants in both of two disjoint sorted interval lists."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def timeline_seconds(result: SimResult, trace: TrainerTrace) -> dict[str, float]:
    """Seconds of ``[0, E]`` per class of the trainer's timeline (module docstring, 1.-5.); keys
    fit, switch, sync, hybrid_trainer, tail."""
    end = result.end_to_end_s
    timeline = result.report.timeline
    classes = [
        ("fit", _union(trace.fit, end)),
        ("switch", _union([*_state_intervals(timeline, SWITCH_STATES, end), *trace.trainer_switch], end)),
        ("sync", _union([*trace.export, *trace.standalone_load], end)),
        ("tail", _union(_drains(trace), end)),
        (
            "hybrid_trainer",
            _intersect(_union(_state_intervals(timeline, frozenset({HYBRID_STATE}), end), end), _ready(trace, end)),
        ),
        ("tail", _union(_tails(trace), end)),
    ]
    points = sorted({0.0, end, *(t for _, ivs in classes for iv in ivs for t in iv)})
    starts = [[a for a, _ in ivs] for _, ivs in classes]
    out = dict.fromkeys(("fit", "switch", "sync", "hybrid_trainer", "tail"), 0.0)
    for a, b in itertools.pairwise(points):
        mid = (a + b) / 2
        for (name, ivs), st in zip(classes, starts, strict=True):
            if _covers(ivs, st, mid):
                out[name] += b - a
                break
    return out


def lost_work_seconds(result: SimResult) -> float:
    """Generation work thrown away, as seconds of the run's mean generation rate (module docstring)."""
    lost = float(result.extra.get("lost_work_tokens", 0.0))
    served = float(result.extra.get("replica_work_tokens", 0.0))
    return result.end_to_end_s * lost / served if served > 0 and lost > 0 else 0.0


def decompose(result: SimResult, trace: TrainerTrace) -> GapCauses:
    """Split ``result``'s gap to its bound into CAUSES using ``trace`` (module docstring)."""
    e = result.end_to_end_s
    t = timeline_seconds(result, trace)
    waiting = e - t["fit"] - t["switch"] - t["sync"] - t["hybrid_trainer"] - t["tail"]
    lost = min(lost_work_seconds(result), max(0.0, waiting))
    paid = {
        "switch": t["switch"],
        "sync": t["sync"],
        "hybrid_trainer": t["hybrid_trainer"],
        "tail": t["tail"],
        "lost_work": lost,
        "imbalance": waiting - lost,
    }
    credit = result.lower_bound_s - t["fit"]
    seconds = dict(paid)
    left = credit
    for group in CREDIT_ORDER:
        held = sum(max(0.0, seconds[name]) for name in group)
        take = min(held, left) if left > 0 else 0.0
        for name in group:
            seconds[name] -= take * max(0.0, seconds[name]) / held if held > 0 else 0.0
        left -= take
    # Credit left over (E < LB), or a credit below 0 by float rounding: the remainder cause.
    seconds["imbalance"] -= left
    return GapCauses(seconds=seconds, gap_s=e - result.lower_bound_s, paid=paid, credit_s=credit)


def gap_causes(result: SimResult) -> dict[str, float]:
    """Seconds per cause of ``result``'s gap to its bound (keys CAUSES; they add up to the gap).

    Empty when the run kept no trainer trace (a SimResult built by hand).
    """
    trace = getattr(result, "trace", None)
    if trace is None or not math.isfinite(result.lower_bound_s):
        return {}
    return decompose(result, trace).seconds


CAUSE_NOTES: dict[str, str] = {
    "switch": "activations, deactivations, rebalances",
    "sync": "weight export and loading",
    "hybrid_trainer": "batch ready, trainer GPUs still generate",
    "tail": "trainer waits for a batch's last sample",
    "lost_work": "aborted and stale-dropped work",
    "imbalance": "remaining wait: generation below the bound",
}
"""One short line per cause, what ``dynres simulate --explain`` prints next to it."""


def explain_rows(result: SimResult) -> list[tuple[str, str, float, float]]:
    """The ``--explain`` table of ``result``: (cause, note, seconds, share of the gap) per cause.

    The share is a fraction of ``end_to_end_s - lower_bound_s`` (NaN when the gap is 0).
    """
    causes = gap_causes(result)
    gap = result.end_to_end_s - result.lower_bound_s
    return [
        (name, CAUSE_NOTES[name], causes[name], causes[name] / gap if gap > 0 else math.nan)
        for name in CAUSES
        if name in causes
    ]
