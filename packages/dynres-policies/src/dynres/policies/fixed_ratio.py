"""`fixed_ratio`: a constant deactivate ratio and a pure backlog-gap activation check."""

from __future__ import annotations

from pydantic import Field

from dynres.core import Policy, ScheduleContext


class FixedRatioPolicy(Policy):
    """Like ``default`` without adaptation and without the cost/benefit gate (for ablations).

    * ``should_deactivate``: whenever hybrid replicas are active.
    * ``deactivate_wait_samples``: ``int(step_required_samples x deactivate_ratio)``; in an
      only-hybrid cluster a whole cycle's samples (the reference forces its ratio to 1 there).
    * ``should_activate_after_step``: always in an only-hybrid cluster; otherwise when the backlog
      gap ``deactivate_ratio x step_required - (total_generated - expected)`` is positive.
    * ``should_rebalance``: yes. ``update_after_step``: nothing to adapt.

    Difference from the reference: it is registered in ``dynres.policies`` like every built-in,
    so ``dynamic_schedule_policy: fixed_ratio`` works with no import step.
    """

    name = "fixed_ratio"

    class Params(Policy.Params):
        """Tunables of the fixed-ratio policy."""

        deactivate_ratio: float = Field(0.3, ge=0.0, le=1.0, description="Fixed ratio (fraction of a cycle's samples).")

    params: Params

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate whenever hybrid replicas are active."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait for ``deactivate_ratio`` of a cycle's samples (a whole cycle's if only-hybrid)."""
        if ctx.only_hybrid:
            return ctx.step_required_samples
        return int(ctx.step_required_samples * self.params.deactivate_ratio)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate whenever the backlog is short of the ratio's target."""
        if ctx.only_hybrid:
            return True
        return self.params.deactivate_ratio * ctx.step_required_samples - ctx.surplus_samples > 0

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Move work onto freshly activated replicas."""
        return True
