"""An example third-party dynres policy, registered as ``example`` in ``dynres.policies``."""

from __future__ import annotations

from pydantic import Field

from dynres.core import Policy, ScheduleContext

__all__ = ["ExamplePolicy"]
__version__ = "0.1.0"


class ExamplePolicy(Policy):
    """Hand hybrid GPUs back once the queue holds ``floor`` of a sync cycle's samples.

    * ``should_deactivate``: whenever hybrid replicas are active.
    * ``deactivate_wait_samples``: ``int(floor x step_required_samples)``.
    * ``should_activate_after_step``: always when the cluster has no standalone replica (nothing
      else would generate); otherwise while the surplus of generated samples is below the floor.
    * ``should_rebalance``: the ``rebalance`` param.
    """

    name = "example"

    class Params(Policy.Params):
        """Tunables of the example policy."""

        floor: float = Field(0.5, ge=0.0, le=1.0, description="Backlog to keep, as a fraction of a cycle's samples.")
        rebalance: bool = Field(True, description="Ask for a rebalance after an activation.")

    params: Params

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Give the GPUs back to the trainer whenever hybrid replicas are generating."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait until the queue holds the floor (never more than a cycle's samples, as floor <= 1)."""
        return int(self.params.floor * ctx.step_required_samples)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate while the backlog is below the floor, and always in an only-hybrid cluster."""
        # Without standalone replicas the hybrid ones are the only producers: saying no here
        # would leave the trainer waiting forever (the testkit's only-hybrid check).
        if ctx.only_hybrid:
            return True
        return ctx.surplus_samples < self.params.floor * ctx.step_required_samples

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Rebalance after an activation when the params say so."""
        return self.params.rebalance
