"""Helpers of the dynres-policies tests: a context builder, hypothesis strategies, and a model of
the reference ``default`` algorithm (as stated in issue 2 / DESIGN.md) to check parity against.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from dynres.core import ScheduleContext

BUILTINS: tuple[str, ...] = ("default", "static_fully_async", "fixed_ratio", "predictive")
"""Registry names of the built-in policies."""


def make_ctx(**overrides: Any) -> ScheduleContext:
    """A valid context: 25 samples x 4 collections = 100 per cycle, 2 standalone + 2 hybrid."""
    fields: dict[str, Any] = dict(
        required_samples=25,
        trigger_parameter_sync_step=4,
        num_standalone_replicas=2,
        num_hybrid_replicas=2,
        global_steps=1,
    )
    fields.update(overrides)
    return ScheduleContext(**fields)


class ReferenceDefault:
    """The reference algorithm, transcribed from its specification for parity tests.

    It keeps the reference's two traits that dynres changes on purpose: the ratio has no lower
    bound, and the activation gate stores the per-sample estimate as a side effect (only when the
    backlog gap is positive: with no gap it answers no before reaching the gate).
    """

    def __init__(self, ratio: float = 0.3, *, floor: bool = False) -> None:
        self.ratio = ratio
        self.floor = floor  # True: clamp at 0 like dynres, to compare whole runs
        self.switch_costs: list[float] = []
        self.per_sample_time_s = 1000.0

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        # verl builds its policy with only_hybrid and then forces the ratio to 1.
        return int(ctx.step_required_samples * (1.0 if ctx.only_hybrid else self.ratio))

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        if ctx.only_hybrid:
            return True
        gap = self.ratio * ctx.step_required_samples - (ctx.total_generated_samples - ctx.expected_samples)
        if gap <= 0:
            # verl 0.9.1 answers no before its cost gate, so the estimate is left as it was.
            return False
        waited_s, waited_n = sum(ctx.step_wait_times), sum(ctx.step_wait_samples)
        if waited_s > 0 and waited_n > 0 and waited_s / waited_n > 0:  # dynres: no underflow to 0.0
            self.per_sample_time_s = waited_s / waited_n
        recent = self.switch_costs[-3:]
        cost = sum(recent) / len(recent) if recent else 10.0
        return max(0.0, gap) * self.per_sample_time_s > cost

    def update_after_step(self, ctx: ScheduleContext) -> None:
        if ctx.global_steps <= 0 or ctx.only_hybrid:
            return
        switch = ctx.last_activate_duration_s + ctx.last_deactivate_duration_s
        if switch > 0:
            self.switch_costs.append(switch)
        waited = sum(ctx.step_wait_samples)
        if waited > 0:
            step = min(0.1, max(0.02, waited / ctx.step_required_samples))
            self.ratio = min(1.0, self.ratio + step)
        else:
            self.ratio -= 0.02
            if self.floor:
                self.ratio = max(0.0, self.ratio)


# ---- Hypothesis strategies ---------------------------------------------------------------------

_often_zero_seconds = st.one_of(st.just(0.0), st.floats(0.0, 600.0))


@st.composite
def contexts(
    draw: st.DrawFn,
    *,
    only_hybrid: bool | None = None,
    max_global_steps: int = 50,
    global_steps: int | None = None,
) -> ScheduleContext:
    """Random valid contexts over the whole field space (sizes kept within realistic bounds)."""
    required = draw(st.integers(1, 256))
    trigger = draw(st.integers(1, 8))
    n = draw(st.integers(0, trigger))
    if only_hybrid is None:
        only_hybrid = draw(st.booleans())
    standalone = 0 if only_hybrid else draw(st.integers(1, 16))
    hybrid = draw(st.integers(1 if only_hybrid else 0, 16))
    active = draw(st.integers(0, standalone + hybrid))
    step_required = required * trigger
    if global_steps is None:
        global_steps = draw(st.integers(0, max_global_steps))
    expected = draw(st.one_of(st.just(step_required * global_steps), st.integers(0, 100_000)))
    return ScheduleContext(
        global_steps=global_steps,
        now=draw(st.floats(0.0, 1e6)),
        required_samples=required,
        trigger_parameter_sync_step=trigger,
        staleness_threshold=draw(st.floats(0.0, 1.0)),
        total_generated_samples=draw(
            st.one_of(st.integers(max(0, expected - step_required), expected + step_required), st.integers(0, 100_000))
        ),
        expected_samples=expected,
        queue_size=draw(st.integers(0, 2 * step_required)),
        in_flight_samples=draw(st.integers(0, 4096)),
        step_wait_times=tuple(draw(st.lists(_often_zero_seconds, min_size=n, max_size=n))),
        step_wait_samples=tuple(
            draw(st.lists(st.one_of(st.just(0), st.integers(0, required)), min_size=n, max_size=n))
        ),
        is_hybrid_active=draw(st.booleans()) and hybrid > 0,
        num_standalone_replicas=standalone,
        num_hybrid_replicas=hybrid,
        num_active_replicas=active,
        last_activate_duration_s=draw(st.one_of(st.just(0.0), st.floats(0.0, 120.0))),
        last_deactivate_duration_s=draw(st.one_of(st.just(0.0), st.floats(0.0, 120.0))),
        generation_rate=draw(st.floats(0.0, 1e4)),
        consumption_rate=draw(st.floats(0.0, 1e4)),
        last_train_time_s=draw(_often_zero_seconds),
        last_cycle_time_s=draw(_often_zero_seconds),
    )


@st.composite
def default_params(draw: st.DrawFn) -> dict[str, Any]:
    """Random valid params of the default policy."""
    ratio = draw(st.floats(0.0, 1.0))
    low, high = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2)))
    return {
        "deactivate_ratio": ratio,
        "min_ratio": draw(st.floats(0.0, ratio)),
        "ratio_increase_min": low,
        "ratio_increase_max": high,
        "ratio_decrease_step": draw(st.floats(0.0, 1.0)),
        "switch_cost_window": draw(st.integers(1, 6)),
        "switch_cost_fallback_s": draw(st.floats(0.0, 1e4)),
        "initial_per_sample_time_s": draw(st.floats(1e-3, 1e4)),
    }


def params_for(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Random valid params for the built-in policy ``name``."""
    if name == "default":
        return default_params()
    if name == "fixed_ratio":
        return st.fixed_dictionaries({"deactivate_ratio": st.floats(0.0, 1.0)})
    return st.just({})


@st.composite
def runs(draw: st.DrawFn, max_cycles: int = 12) -> list[ScheduleContext]:
    """Consecutive cycles of one cluster: global_steps counts up (often from 0), shape fixed."""
    only_hybrid = draw(st.sampled_from([False, False, False, True]))
    first = draw(st.one_of(st.just(0), st.integers(0, 50)))
    cycles = draw(st.integers(1, max_cycles))
    return [draw(contexts(only_hybrid=only_hybrid, global_steps=first + k)) for k in range(cycles)]
