"""Helpers of the dynres-verl tests: hypothesis strategies for verl-style runs and a paired driver.

The driver plays verl's trainer call order (read from verl 0.9.1's fully_async_trainer.py):
per collection ``should_deactivate`` (and ``deactivate_wait_samples`` when it says yes); after
the cycle's last collection the context's counters are refreshed, then
``should_activate_after_step``, ``request_rebalance`` after an activation, ``update_after_step``,
and the cycle's switch times are reset. It feeds the same inputs to verl's policy and to a dynres
policy and records both answers of every decision.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from dynres.core import Policy
from dynres.verl._verl import schedule_module
from dynres.verl.contexts import VerlContextReader


@dataclass(frozen=True)
class Cluster:
    """The constants of one generated run."""

    required_samples: int
    trigger: int
    staleness: float
    only_hybrid: bool
    ratio: float


@dataclass(frozen=True)
class CycleInput:
    """What happens in one sync cycle of a generated run."""

    wait_times: tuple[float, ...]
    wait_samples: tuple[int, ...]
    generated: int
    deactivate_s: float
    activate_s: float


@dataclass
class Decision:
    """One decision as both policies answered it."""

    method: str
    global_steps: int
    verl: Any
    dynres: Any
    verl_ratio: float | None
    """verl's deactivate_ratio when the decision was made (None for policies without one)."""


@dataclass
class Run:
    """The decisions of one run, in call order."""

    cluster: Cluster
    decisions: list[Decision] = field(default_factory=list)


_seconds = st.one_of(st.just(0.0), st.floats(0.001, 600.0, allow_nan=False, allow_infinity=False))


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """Cluster constants: small and large cycles, only-hybrid about one run in five."""
    return Cluster(
        required_samples=draw(st.integers(1, 64)),
        trigger=draw(st.integers(1, 4)),
        staleness=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        only_hybrid=draw(st.integers(0, 4)) == 0,
        ratio=draw(st.one_of(st.just(0.3), st.floats(0.0, 1.0, allow_nan=False))),
    )


@st.composite
def cycle_inputs(draw: st.DrawFn, cluster: Cluster) -> CycleInput:
    """One cycle: waits or none (times and counts each zero or not), production around the need."""
    step = cluster.required_samples * cluster.trigger
    waits, counts = [], []
    quiet = draw(st.integers(0, 9)) < 4  # a cycle served from backlog: the ratio goes down
    for _ in range(cluster.trigger):
        waits.append(0.0 if quiet else draw(_seconds))
        counts.append(0 if quiet else draw(st.one_of(st.just(0), st.integers(0, cluster.required_samples))))
    return CycleInput(
        wait_times=tuple(waits),
        wait_samples=tuple(counts),
        generated=draw(st.integers(0, 2 * step + 2)),
        deactivate_s=draw(_seconds),
        activate_s=draw(_seconds),
    )


@st.composite
def runs(draw: st.DrawFn, max_cycles: int = 40) -> tuple[Cluster, list[CycleInput]]:
    """A cluster and 1..max_cycles cycles."""
    cluster = draw(clusters())
    cycles = draw(st.lists(cycle_inputs(cluster), min_size=1, max_size=max_cycles))
    return cluster, cycles


def verl_class(name: str) -> type[Any]:
    """verl's policy class ``name`` (fixed_ratio is shipped but registered only once imported)."""
    from dynres.verl._verl import registered_verl_class

    return registered_verl_class(name)


def drive_pair(verl_name: str, dynres_cls: type[Policy], cluster: Cluster, cycles: list[CycleInput]) -> Run:
    """Run verl's ``verl_name`` and ``dynres_cls`` side by side on the same inputs; return the decisions."""
    mod = schedule_module()
    with contextlib.redirect_stdout(io.StringIO()):
        vpol = verl_class(verl_name)(deactivate_ratio=cluster.ratio, only_hybrid=cluster.only_hybrid)
    asked: list[str] = []

    class Rollouter:  # records the rebalance verl's policy asks for; raising stops it before ray.get
        class rebalance_requests:
            @staticmethod
            def remote() -> Any:
                asked.append("rebalance_requests")
                raise RuntimeError("recorded")

    vpol._rollouter = Rollouter()
    params = {"deactivate_ratio": cluster.ratio} if "deactivate_ratio" in dynres_cls.Params.model_fields else {}
    dpol = dynres_cls(params)
    reader = VerlContextReader(only_hybrid=cluster.only_hybrid, clock=lambda: 0.0)
    step = cluster.required_samples * cluster.trigger
    ctx = mod.DynamicScheduleContext(
        required_samples=cluster.required_samples,
        trigger_parameter_sync_step=cluster.trigger,
        total_generated_samples=0,
        expected_samples=0,
        buffer_samples=0,
        only_hybrid=cluster.only_hybrid,
    )
    run = Run(cluster)
    active = False
    generated = 0

    def record(method: str, gs: int, v: Any, d: Any) -> None:
        run.decisions.append(Decision(method, gs, v, d, getattr(vpol, "deactivate_ratio", None)))

    def sctx(gs: int) -> Any:
        return reader.read(ctx, global_steps=gs, is_hybrid_active=active)

    with contextlib.redirect_stdout(io.StringIO()):  # verl's policies print every decision
        # Startup: verl's trainer has synced weights before the first cycle; dynres asks the
        # activation question at global_steps=0 (verl's own update skips step 0).
        gs = 0
        v = vpol.should_activate_after_step(gs, active, ctx)
        d = dpol.should_activate_after_step(sctx(gs))
        record("should_activate_after_step", gs, v, d)
        dpol.update_after_step(sctx(gs))
        vpol.update_after_step(gs, ctx)
        active = bool(v)
        for cyc in cycles:
            for _ in range(cluster.trigger):
                v = vpol.should_deactivate(gs, active, ctx)
                d = dpol.should_deactivate(sctx(gs))
                record("should_deactivate", gs, v, d)
                if v:
                    vw = vpol.deactivate_wait_samples(ctx)
                    dw = dpol.deactivate_wait_samples(sctx(gs))
                    record("deactivate_wait_samples", gs, vw, dw)
                    ctx.last_deactivate_duration_s += cyc.deactivate_s
                    active = False
            gs += 1
            generated += cyc.generated
            ctx.total_generated_samples = generated
            ctx.expected_samples = step * gs
            ctx.buffer_samples = step * cluster.staleness
            ctx.step_wait_times = list(cyc.wait_times)
            ctx.step_wait_samples = list(cyc.wait_samples)
            v = vpol.should_activate_after_step(gs, active, ctx)
            d = dpol.should_activate_after_step(sctx(gs))
            record("should_activate_after_step", gs, v, d)
            if v:
                ctx.last_activate_duration_s += cyc.activate_s
                active = True
                before = len(asked)
                vpol.request_rebalance(gs, ctx)
                d = dpol.should_rebalance(sctx(gs))
                record("should_rebalance", gs, len(asked) > before, d)
            dpol.update_after_step(sctx(gs))
            vpol.update_after_step(gs, ctx)
            ctx.last_activate_duration_s = ctx.last_deactivate_duration_s = 0.0
    return run


DOCUMENTED = {
    "ratio_floor": "default: verl's ratio went below 0 (dynres keeps it >= min_ratio); DefaultPolicy difference 1",
    "static_only_hybrid": "static_fully_async: dynres activates in an only-hybrid cluster, verl never does",
}
"""The documented differences a parity mismatch may be attributed to (key -> where it is documented)."""


def classify(run: Run) -> list[tuple[Decision, str]]:
    """Each unequal decision of ``run`` with the documented difference explaining it ('' if none)."""
    out: list[tuple[Decision, str]] = []
    below_zero = False
    for d in run.decisions:
        below_zero = below_zero or (d.verl_ratio is not None and d.verl_ratio < 0)
        if d.verl == d.dynres:
            continue
        why = ""
        if below_zero:
            why = "ratio_floor"
        elif (
            d.method == "should_activate_after_step"
            and run.cluster.only_hybrid
            and d.verl is False
            and d.dynres is True
        ):
            why = "static_only_hybrid"
        out.append((d, why))
    return out
