"""What a ``dynres run`` shows while it starts and runs: start-up phases and the live run status.

Start-up is told as phases through a callback ``on_phase(phase, done, total)``: :data:`RAY`,
:data:`MODEL`, :data:`ENGINES` (``done`` of ``total`` engines started) and :data:`CALIBRATION`;
then the run's status, polled from the run (in this process or in the coordinator actor) by
:func:`run_status`: controller state, queue size, requests in flight, and whether the switch
calibration is still going before cycle 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RAY = "ray"
"""Phase: connecting to (or starting) Ray."""
MODEL = "model"
"""Phase: building the tiny model, or checking ``model.path``."""
ENGINES = "engines"
"""Phase: starting the engines (``done`` of ``total``)."""
CALIBRATION = "calibration"
"""Phase: the switch calibration before cycle 1 (status ``phase``)."""
CYCLES = "cycles"
"""Phase: the sync cycles (status ``phase``)."""

PhaseCallback = Callable[[str, int, int], Any]
"""``on_phase(phase, done, total)``: a start-up phase began or moved on (``total`` 0: no count)."""


def run_status(run: Any) -> dict[str, Any]:
    """A live snapshot of a FullyAsyncRun: state, queue, in-flight requests, counters and its phase.

    ``phase`` is :data:`CALIBRATION` while the run has hybrid replicas, nothing generated yet and
    no cycle done (the switch calibration runs before the rollouter starts), else :data:`CYCLES`.
    """
    if run is None or run.controller is None:
        return {"state": "STARTING", "phase": CALIBRATION}
    out: dict[str, Any] = {
        "state": run.controller.state.value,
        "queue": run.queue.size if run.queue is not None else 0,
        "in_flight": run.balancer.total_in_flight if run.balancer is not None else 0,
        "routable": run.balancer.replica_ids if run.balancer is not None else [],
        "quarantined": dict(run.controller.quarantined),
    }
    generated = run.rollouter.generated if run.rollouter is not None else 0
    out["generated"] = generated
    if run.queue is not None:
        out["consumed"] = run.queue.consumed
    calibrating = bool(run.spec.hybrid) and generated == 0 and not run.tracker.global_steps
    out["phase"] = CALIBRATION if calibrating else CYCLES
    return out
