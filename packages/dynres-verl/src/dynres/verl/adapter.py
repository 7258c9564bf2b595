"""dynres policies inside verl: a ``DynamicSchedulePolicyBase`` subclass per installed dynres policy.

verl's trainer builds its policy with ``build_policy(name, deactivate_ratio=..., only_hybrid=...)``,
sets ``policy._rollouter`` to the rollouter's actor handle and then calls, per sync cycle,
``should_deactivate`` / ``deactivate_wait_samples`` before training and
``should_activate_after_step`` / ``request_rebalance`` / ``update_after_step`` after it. The
adapter translates each call into the dynres policy's method on a
:class:`~dynres.core.ScheduleContext` (see :mod:`dynres.verl.contexts`) and guards it
(:class:`~dynres.verl.guard.SyncGuard`), which also applies the dynres runtime's safety clamps
(:func:`dynres.core.answers.clamp_answer`): an only-hybrid cluster always activates and waits for
at least a cycle's samples before handing the GPUs back, and no wait exceeds a cycle's samples
plus the staleness buffer. The adapter acts on the guard's answers as they come.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from dynres.core import BoundPolicy, Policy, ScheduleContext, get_plugin_manager, resolve_policy_class
from dynres.verl.contexts import VerlContextReader
from dynres.verl.guard import SyncGuard
from dynres.verl.live import RolloutSnapshot
from dynres.verl.params import build_params

logger = logging.getLogger("dynres.verl")

PREFIX = "dynres:"
"""Prefix of dynres policies in verl's registry (``dynres:default`` never meets verl's ``default``)."""

DECISION_TIMEOUT_S = 10.0
"""Longest one dynres decision may take inside verl before the safe value is used (seconds)."""

RPC_TIMEOUT_S = 30.0
"""Longest the adapter waits for one reading of verl's rollouter before it counts as unknown (seconds)."""


def _resolve(value: Any, timeout_s: float | None) -> Any:
    # A Ray actor method returns an ObjectRef to be fetched; a plain object (a stub rollouter in
    # tests and offline drivers) returns its answer directly. ray.get is only called on a real
    # ObjectRef, so a driver without Ray never starts a Ray session through us.
    try:
        import ray
    except ImportError:
        return value
    if isinstance(value, ray.ObjectRef):
        return ray.get(value, timeout=timeout_s)
    return value


class DynresPolicyAdapter:
    """A dynres policy behind verl's policy interface; :func:`adapter_class` mixes it into verl's base.

    Kept free of verl at import time: ``import verl`` loads our plugin, which needs this module,
    so this module must not be what imports verl.
    """

    dynres_policy: ClassVar[str] = ""
    """Registry name of the dynres policy this class adapts."""

    def __init__(self, deactivate_ratio: float | None = None, only_hybrid: bool = False, **kwargs: Any) -> None:
        """Build the dynres policy with ``DYNRES_VERL_PARAMS`` and verl's ratio; raise one-line errors."""
        if kwargs:
            logger.warning(
                "dynres policy %r: verl passed constructor arguments dynres does not know (%s); ignored",
                self.dynres_policy,
                ", ".join(sorted(kwargs)),
            )
        cls = resolve_policy_class(self.dynres_policy)
        self.policy: Policy = cls(build_params(cls, deactivate_ratio=deactivate_ratio))
        """The dynres policy making the decisions."""
        self.only_hybrid = bool(only_hybrid)
        """True when the cluster has no standalone replicas (verl's only_hybrid)."""
        self.reader = VerlContextReader(only_hybrid=self.only_hybrid)
        """Turns verl's contexts into ScheduleContexts."""
        self.guard = SyncGuard(BoundPolicy(self.policy, get_plugin_manager()), timeout_s=DECISION_TIMEOUT_S)
        """Runs the decisions safely: timeout, answer checks, safe fallbacks, clamps."""
        self.rebalances = 0
        """Rebalances asked of the rollouter (count)."""
        self._rollouter: Any = None  # verl's DynamicResourceController sets this attribute
        self._counted = False
        self._warned = False
        self._last_steps = 0
        self._last_active = False

    # ---- verl's interface ----------------------------------------------------------------

    def should_deactivate(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        """Ask the dynres policy whether to hand the hybrid replicas back before training.

        verl asks before every fit step, which is also how the adapter knows a fit step began; a
        dynres policy is asked only while hybrid replicas are active (its contract, as in the
        dynres runtime), so with none active the answer is False and the policy is not called.
        """
        self._observe()
        self.reader.timeline.fit_step(self.reader.clock(), bool(is_hybrid_active))
        sctx = self._context(ctx, global_steps, is_hybrid_active)
        if not is_hybrid_active:
            return False
        return bool(self.guard.decide("should_deactivate", sctx))

    def deactivate_wait_samples(self, ctx: Any) -> int:
        """Samples to wait for before deactivating, clamped (by the guard) like the dynres runtime clamps them."""
        sctx = self._context(ctx, self._last_steps, self._last_active)
        target = int(self.guard.decide("deactivate_wait_samples", sctx))
        self.reader.timeline.waiting(self.reader.clock(), target, self.reader.snapshot)
        return target

    def should_activate_after_step(self, global_steps: int, is_hybrid_active: bool, ctx: Any) -> bool:
        """Ask the dynres policy whether the hybrid replicas generate next cycle (always in only-hybrid)."""
        self._observe()
        self.reader.timeline.before_sync(self.reader.clock(), ctx, self.reader.snapshot)
        sctx = self._context(ctx, global_steps, is_hybrid_active)
        return bool(self.guard.decide("should_activate_after_step", sctx))

    def request_rebalance(self, global_steps: int, ctx: Any) -> None:
        """When the dynres policy agrees, ask the rollouter to rebalance, as verl's default does."""
        sctx = self._context(ctx, global_steps, True)
        if not self.guard.decide("should_rebalance", sctx):
            return
        if self._rollouter is None:
            logger.info("dynres policy %r: rebalance skipped, verl gave no rollouter", self.policy.name)
            return
        try:
            result = _resolve(self._rollouter.rebalance_requests.remote(), timeout_s=None)
        except Exception as exc:  # a failed rebalance must not stop training (verl's default: same)
            logger.warning("dynres policy %r: rebalance failed at step %d: %s", self.policy.name, global_steps, exc)
            return
        self.rebalances += 1
        logger.info("dynres policy %r: rebalanced at step %d: %s", self.policy.name, global_steps, result)

    def update_after_step(self, global_steps: int, ctx: Any) -> None:
        """Let the dynres policy adapt after the weight sync (the cycle's figures now include it)."""
        self._observe()
        self.reader.timeline.after_sync(self.reader.clock(), ctx, self.reader.snapshot)
        sctx = self._context(ctx, global_steps, self._last_active)
        self.guard.decide("update_after_step", sctx)

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Take time from ``clock`` (seconds): a simulated verl run passes its virtual clock, whose
        time base its rollouter's stamps share; a real run keeps wall time."""
        self.reader.use_clock(clock)

    # ---- helpers ---------------------------------------------------------------------------

    def _context(self, ctx: Any, global_steps: int, is_hybrid_active: bool) -> ScheduleContext:
        self._count_replicas()
        self._last_steps, self._last_active = int(global_steps), bool(is_hybrid_active)
        return self.reader.read(ctx, global_steps=global_steps, is_hybrid_active=is_hybrid_active)

    def _count_replicas(self) -> None:
        # Once, when verl has injected its rollouter: the real replica counts.
        if self._counted or self._rollouter is None:
            return
        self._counted = True
        try:
            standalone = _resolve(self._rollouter.get_standalone_replicas.remote(), timeout_s=RPC_TIMEOUT_S)
            hybrid = _resolve(self._rollouter.get_all_hybrid_replicas.remote(), timeout_s=RPC_TIMEOUT_S)
            self.reader.set_replica_counts(len(standalone), len(hybrid))
        except Exception as exc:
            logger.info("dynres policy %r: replica counts unknown (%s); using the defaults", self.policy.name, exc)

    def _observe(self) -> None:
        """Read verl's rollouter: the run's length once, its counters and stamps at every call.

        Each reading is one short actor call at a point where verl's trainer already waits on the
        rollouter; a rollouter that does not answer leaves the fields at their "unknown" 0.
        """
        if self._rollouter is None:
            return
        try:
            if not self.reader.total_steps:
                total = _resolve(self._rollouter.get_total_train_steps.remote(), timeout_s=RPC_TIMEOUT_S)
                self.reader.total_steps = max(0, int(total or 0))
            stats = _resolve(self._rollouter.get_hybrid_statistics.remote(), timeout_s=RPC_TIMEOUT_S)
            self.reader.snapshot = RolloutSnapshot.from_stats(stats)
        except Exception as exc:
            if not self._warned:
                logger.warning(
                    "dynres policy %r: verl's rollouter did not report its state (%s); queue, "
                    "in-flight and hybrid figures read as unknown until it does",
                    self.policy.name,
                    exc,
                )
            self._warned = True
            self.reader.snapshot = None


def adapter_class(name: str) -> type[DynresPolicyAdapter]:
    """The verl policy class adapting dynres policy ``name`` (registered as ``dynres:<name>``).

    A subclass of verl's ``DynamicSchedulePolicyBase`` with :class:`DynresPolicyAdapter`'s methods.
    """
    from dynres.verl._verl import schedule_module

    return type(
        f"DynresPolicy[{name}]",
        (DynresPolicyAdapter, schedule_module().DynamicSchedulePolicyBase),
        {"dynres_policy": name, "__doc__": f"dynres policy {name!r} adapted to verl's policy interface."},
    )
