"""The switch calibration: measured switches of the hybrid replicas before the first cycle.

A run whose policy never switches (``static_fully_async``, or a policy that finds no switch worth
it) records no sleep, wake-up, offload or onload, so nothing fitted to it knows what a switch
costs on its engines. When :attr:`~dynres.runtime.loop.spec.RunSpec.calibration_switches` is > 0
and the run has hybrid replicas, :func:`run_switch_calibration` carries out that many switch round
trips before the rollouter starts, in the controller's order:

0. hybrid replicas that report themselves awake (``health().sleeping`` false; a vLLM engine
   starts awake) are put to sleep first: the state the controller assumes before its first
   activation. That sleep is measured like the others. The run does this step whatever
   ``calibration_switches`` says (with 0 round trips nothing else happens): an awake hybrid replica
   would hold GPU memory the trainer needs from its first train step;
1. the trainer offloads; 2. each hybrid replica wakes its weights, 3. loads the current weights,
4. wakes its KV cache; 5. sleeps; 6. the trainer onloads.

Every step goes through its own :class:`~dynres.runtime.loop.ops.OpRunner` (same timeout and run
clock as the run's), so the durations land in :class:`SwitchCalibration`, never in the run's
``operations.engine`` timings nor in its activation/deactivation counts: they are not cycle
switches. Nothing is generating yet, so the calibration measures an idle switch; the abort of
in-flight requests that a deactivation also does is not part of it. A hybrid replica that fails a
step is quarantined (as the controller would); a failed trainer offload ends the calibration; a
failed onload raises, since training cannot go on without the trainer's memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dynres.core.errors import BackendError
from dynres.runtime.loop.controller import Controller
from dynres.runtime.loop.ops import OpFailure, OpRunner
from dynres.runtime.protocols import Replica, TrainEngine

CALIBRATION_OPS: tuple[str, ...] = ("sleep", "offload", "wake_up", "update_weights", "onload")
"""Operations the calibration times (names as in the run's operation timings)."""


@dataclass(frozen=True)
class CalibrationStep:
    """One timed operation of the switch calibration."""

    round: int
    """Switch round trip it belongs to (0-based; the initial sleep is in round 0)."""
    op: str
    """Operation: one of CALIBRATION_OPS."""
    target: str
    """Replica id, or ``"trainer"``."""
    detail: str
    """``initial`` for the first sleep of an awake replica; the wake_up tag (``weights``,
    ``kv_cache``); else ''."""
    duration_s: float
    """Run-clock duration of the call (seconds)."""
    ok: bool
    """False when the call raised or timed out."""


@dataclass
class SwitchCalibration:
    """What the switch calibration measured (in ``report.json`` under ``switch_calibration``)."""

    rounds: int
    """Switch round trips asked for (count)."""
    start_s: float
    """Run-clock time the calibration started (seconds since run start)."""
    end_s: float
    """Run-clock time it ended (seconds since run start); the first cycle starts after it."""
    steps: list[CalibrationStep] = field(default_factory=list)
    """Every timed call, in order."""
    failures: list[OpFailure] = field(default_factory=list)
    """Calls that raised or timed out (also in the run's op_failures)."""

    @property
    def duration_s(self) -> float:
        """Time the calibration added before the first cycle (seconds)."""
        return self.end_s - self.start_s

    def durations(self, op: str, detail: str | None = None) -> list[float]:
        """Durations of the successful ``op`` calls (``detail``: only those with that detail; seconds)."""
        return [s.duration_s for s in self.steps if s.op == op and s.ok and (detail is None or s.detail == detail)]


async def run_switch_calibration(  # noqa: C901  # the switch steps in order, a quarantine at each
    *,
    rounds: int,
    hybrid: list[Replica],
    train_engine: TrainEngine,
    controller: Controller,
    weight_version: int,
    timeout_s: float,
    now: Any,
    sleep_level: int = 1,
    record: SwitchCalibration | None = None,
) -> SwitchCalibration:
    """Measure ``rounds`` switch round trips of ``hybrid`` and the trainer; see the module text.

    ``weight_version`` is the version the loaded weights carry (the run's current one), so a
    calibrated replica is never ahead of the standalone ones. ``record``: fill this
    SwitchCalibration (so a caller keeps what was measured when the calibration is interrupted or
    raises) instead of a new one. Raises BackendError when the trainer cannot onload.
    """
    ops = OpRunner(timeout_s=timeout_s, now=now)
    calibration = record if record is not None else SwitchCalibration(rounds=rounds, start_s=now(), end_s=now())
    replicas = [r for r in hybrid if r.replica_id not in controller.quarantined]

    async def timed(rnd: int, op: str, target: str, detail: str, call: Any) -> bool:
        t0 = now()
        ok = True
        try:
            await ops.one(op, target, call)
        except BackendError:
            ok = False
        calibration.steps.append(CalibrationStep(rnd, op, target, detail, now() - t0, ok))
        return ok

    async def on_replicas(rnd: int, op: str, detail: str, call: Any) -> None:
        nonlocal replicas
        oks = await asyncio.gather(*(timed(rnd, op, r.replica_id, detail, _bind(call, r)) for r in replicas))
        for r, ok in zip(list(replicas), oks, strict=True):
            if not ok:
                controller.quarantine(r, f"{op} failed in the switch calibration")
        replicas = [r for r, ok in zip(replicas, oks, strict=True) if ok]

    try:
        awake = []
        for r in replicas:
            try:
                health = await ops.one("health", r.replica_id, r.health)
            except BackendError:
                controller.quarantine(r, "health check failed in the switch calibration")
                continue
            if not health.sleeping:
                awake.append(r)
        if awake:
            others = [r for r in replicas if r not in awake and r.replica_id not in controller.quarantined]
            replicas = awake
            await on_replicas(0, "sleep", "initial", lambda r: r.sleep(sleep_level))
            replicas += others
        replicas = [r for r in hybrid if r in replicas and r.replica_id not in controller.quarantined]
        if replicas and rounds > 0:
            # Exported before the offload, as a cycle's sync does before an activation.
            exported = await ops.one("export_weights", "trainer", train_engine.export_weights)
            update = dataclasses.replace(exported, version=weight_version)
        for rnd in range(rounds):
            if not replicas or not await timed(rnd, "offload", "trainer", "", train_engine.offload):
                break
            await on_replicas(rnd, "wake_up", "weights", lambda r: r.wake_up(["weights"]))
            await on_replicas(rnd, "update_weights", "", lambda r: r.update_weights(update))
            await on_replicas(rnd, "wake_up", "kv_cache", lambda r: r.wake_up(["kv_cache"]))
            await on_replicas(rnd, "sleep", "", lambda r: r.sleep(sleep_level))
            if not await timed(rnd, "onload", "trainer", "", train_engine.onload):
                raise BackendError(
                    "the trainer could not onload after the switch calibration's offload; training cannot go on. "
                    "Check the train engine, or set run.calibration_switches: 0 to skip the calibration"
                )
    finally:
        calibration.end_s = now()
        calibration.failures = list(ops.failures)
    return calibration


def _bind(call: Any, replica: Replica) -> Any:
    """A no-argument callable running ``call(replica)`` (OpRunner.one takes one)."""
    return lambda: call(replica)
