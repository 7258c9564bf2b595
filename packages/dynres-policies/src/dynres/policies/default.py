"""`default`: adaptive deactivate ratio with a cost/benefit gate on activation."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from dynres.core import Policy, ScheduleContext
from dynres.core.errors import PolicyValidationError


class DefaultPolicy(Policy):
    """Adapt how long hybrid replicas keep generating, and activate them only when it pays.

    Decisions, per sync cycle:

    * ``should_deactivate``: whenever hybrid replicas are active.
    * ``deactivate_wait_samples``: ``int(step_required_samples x ratio)``; in an only-hybrid
      cluster a whole cycle's samples (nothing generates once the hybrid replicas sleep).
    * ``should_activate_after_step``: always in an only-hybrid cluster; otherwise when the
      backlog gap ``ratio x step_required - (total_generated - expected)`` converted to seconds
      with the per-sample time estimate exceeds the mean of the last ``switch_cost_window``
      measured switch costs (``switch_cost_fallback_s`` when none were measured).
    * ``should_rebalance``: yes (the controller only asks when rebalancing is enabled).
    * ``update_after_step`` (skipped in only-hybrid clusters): if the backlog gap was positive,
      refresh the per-sample time estimate from the cycle's waits (``sum(step_wait_times) /
      sum(step_wait_samples)`` when both are positive); then, unless ``global_steps <= 0``,
      record the cycle's activate+deactivate time as a switch cost, and if the cycle had to wait
      for samples raise the ratio by ``clip(waited / step_required, ratio_increase_min,
      ratio_increase_max)``, else lower it by ``ratio_decrease_step``.

    Deliberate differences from the reference implementation (each has a test, and
    dynres-verl's parity test runs verl's own code against this class):

    1. The ratio stays within ``[min_ratio, 1]`` (default ``[0, 1]``); the reference has no lower
       bound and can drift below zero, after which its waits are negative and its decisions
       part from these.
    2. The per-sample time estimate changes exactly where the reference changes it, in a cycle
       whose backlog gap was positive, but it is stored in ``update_after_step``: the reference
       stores it inside ``should_activate_after_step``. Both the dynres runtime and verl's
       trainer call ``update_after_step`` right after ``should_activate_after_step`` with the same
       context and ratio, so the stored values are equal; the decision methods here never change
       state, so asking twice gives the same answer.
    3. The estimate and the switch-cost window are part of ``state_dict``, so a resumed run keeps
       what it learned.

    The reference forces its ratio to 1 in an only-hybrid cluster; here the ratio is kept, and
    only the wait is a whole cycle's samples, which is the one decision that ratio changes there.
    """

    name = "default"

    class Params(Policy.Params):
        """Tunables of the default policy."""

        # An infinite fallback cost or sample time would turn the gate into NaN comparisons and
        # make state_dict() emit non-standard JSON.
        model_config = ConfigDict(allow_inf_nan=False)

        deactivate_ratio: float = Field(
            0.3, ge=0.0, le=1.0, description="Starting ratio (fraction of a cycle's samples)."
        )
        min_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Lowest ratio adaptation may reach (fraction).")
        ratio_increase_min: float = Field(
            0.02, ge=0.0, le=1.0, description="Smallest raise after a cycle that waited (fraction)."
        )
        ratio_increase_max: float = Field(
            0.1, ge=0.0, le=1.0, description="Largest raise after a cycle that waited (fraction)."
        )
        ratio_decrease_step: float = Field(
            0.02, ge=0.0, le=1.0, description="Cut after a cycle that did not wait (fraction)."
        )
        switch_cost_window: int = Field(3, ge=1, description="Measured switch costs averaged by the gate (count).")
        switch_cost_fallback_s: float = Field(
            10.0, ge=0.0, description="Switch cost assumed before any was measured (seconds)."
        )
        initial_per_sample_time_s: float = Field(
            1000.0,
            gt=0.0,
            description="Pessimistic per-sample time before any was measured (seconds/sample).",
        )

        @model_validator(mode="after")
        def _check_bounds(self) -> DefaultPolicy.Params:
            if self.ratio_increase_min > self.ratio_increase_max:
                raise ValueError("ratio_increase_min must be <= ratio_increase_max")
            if self.min_ratio > self.deactivate_ratio:
                raise ValueError("min_ratio must be <= deactivate_ratio")
            return self

    params: Params

    def __init__(self, params: Params | Mapping[str, Any] | None = None) -> None:
        """Start from ``params.deactivate_ratio`` with no measured switch cost or sample time."""
        super().__init__(params)
        self.ratio: float = self.params.deactivate_ratio
        self.switch_costs: deque[float] = deque(maxlen=self.params.switch_cost_window)
        self.per_sample_time_s: float = self.params.initial_per_sample_time_s

    # ---- Decisions ------------------------------------------------------------------------

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate whenever hybrid replicas are active."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait for ``ratio`` of a cycle's samples before deactivating (a whole cycle's if only-hybrid)."""
        if ctx.only_hybrid:
            return ctx.step_required_samples
        return int(ctx.step_required_samples * self.ratio)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when the missing backlog would cost more time than a switch."""
        if ctx.only_hybrid:
            return True
        gap = self.backlog_gap(ctx)
        return max(0.0, gap) * self.estimate_per_sample_time(ctx) > self.switch_cost()

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Move work onto freshly activated replicas."""
        return True

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Learn the per-sample time, the switch cost and the ratio from the finished cycle."""
        if ctx.only_hybrid:
            return
        # Computed with the ratio the activation decision used (it changes only below).
        if self.backlog_gap(ctx) > 0:
            self.per_sample_time_s = self.estimate_per_sample_time(ctx)
        if ctx.global_steps <= 0:
            return
        switch = ctx.last_activate_duration_s + ctx.last_deactivate_duration_s
        if switch > 0:
            self.switch_costs.append(switch)
        waited = sum(ctx.step_wait_samples)
        p = self.params
        if waited > 0:
            step = min(p.ratio_increase_max, max(p.ratio_increase_min, waited / ctx.step_required_samples))
            self.ratio = min(1.0, self.ratio + step)
        else:
            self.ratio = max(p.min_ratio, self.ratio - p.ratio_decrease_step)

    # ---- Estimates ------------------------------------------------------------------------

    def backlog_gap(self, ctx: ScheduleContext) -> float:
        """Samples the backlog lacks to reach ``ratio`` of a cycle: ``ratio x step_required - surplus``."""
        return self.ratio * ctx.step_required_samples - ctx.surplus_samples

    def estimate_per_sample_time(self, ctx: ScheduleContext) -> float:
        """Seconds of trainer wait per waited-for sample in ``ctx``, else the last estimate."""
        total_t, total_n = sum(ctx.step_wait_times), sum(ctx.step_wait_samples)
        # A subnormal wait divided by the sample count can round to 0.0, which would zero the
        # activation test's cost side and is not a valid state (load_state_dict refuses it).
        if total_t > 0 and total_n > 0 and total_t / total_n > 0:
            return total_t / total_n
        return self.per_sample_time_s

    def switch_cost(self) -> float:
        """Mean of the recent measured switch costs, or the fallback when none (seconds)."""
        if not self.switch_costs:
            return self.params.switch_cost_fallback_s
        return sum(self.switch_costs) / len(self.switch_costs)

    # ---- State ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Ratio, recent switch costs and per-sample time estimate."""
        return {
            "ratio": self.ratio,
            "switch_costs": list(self.switch_costs),
            "per_sample_time_s": self.per_sample_time_s,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; reject missing or unknown keys."""
        expected = {"ratio", "switch_costs", "per_sample_time_s"}
        if set(state) != expected:
            raise PolicyValidationError(
                f"policy 'default': state keys {sorted(state)} do not match {sorted(expected)}; "
                "pass what state_dict() returned"
            )
        try:
            ratio = float(state["ratio"])
            costs = [float(c) for c in state["switch_costs"]]
            per_sample = float(state["per_sample_time_s"])
        except (TypeError, ValueError) as exc:
            raise PolicyValidationError(
                f"policy 'default': state values must be numbers (switch_costs a list of them): "
                f"{exc}; pass what state_dict() returned"
            ) from None
        if not 0.0 <= ratio <= 1.0:
            raise PolicyValidationError(f"policy 'default': state ratio {ratio} is outside [0, 1]")
        if not all(math.isfinite(c) and c >= 0 for c in costs):
            raise PolicyValidationError(f"policy 'default': state switch_costs {costs} must be finite seconds >= 0")
        if not (math.isfinite(per_sample) and per_sample > 0):
            raise PolicyValidationError(
                f"policy 'default': state per_sample_time_s {per_sample} must be finite seconds > 0"
            )
        self.ratio = ratio
        self.switch_costs = deque(costs, maxlen=self.params.switch_cost_window)
        self.per_sample_time_s = per_sample
