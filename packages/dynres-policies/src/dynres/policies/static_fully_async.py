"""`static_fully_async`: the plain fully-async split, hybrid GPUs only ever train."""

from __future__ import annotations

from dynres.core import Policy, ScheduleContext


class StaticFullyAsyncPolicy(Policy):
    """Never lend trainer GPUs to generation; the baseline to compare other policies against.

    * ``should_deactivate``: whenever hybrid replicas are active.
    * ``deactivate_wait_samples``: 0 (hand the GPUs back at once).
    * ``should_activate_after_step``: only in an only-hybrid cluster (``rollout.nnodes = 0``),
      where hybrid replicas are the only producers: that is classic colocated training.

    Difference from the reference: the reference never activates, even with no standalone
    replicas; here an only-hybrid cluster activates so that it cannot deadlock.
    """

    name = "static_fully_async"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate whenever hybrid replicas are active."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Do not wait."""
        return 0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Only when nothing else could generate."""
        return ctx.only_hybrid
