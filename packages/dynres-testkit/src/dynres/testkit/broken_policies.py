"""Deliberately broken policies: each one breaks the property of exactly one conformance check.

They prove that every check can fail (a check that cannot fail tests nothing) and show, by
example, the mistakes the checks exist to catch. Most are plausible bugs rather than sabotage.
They are not registered as entry points; name one as ``dynres.testkit.broken_policies:Class``::

    pytest --dynres-policy dynres.testkit.broken_policies:QueueFloorPolicy

:data:`BROKEN_POLICIES` maps each check name to the policies that must fail it and the text its
failure message must contain.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from dynres.core import Policy, RequestContext, ScheduleContext


class _Sound(Policy):
    """A small correct policy the broken ones start from: activate when the queue runs behind."""

    name = "sound"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate whenever hybrid replicas are active."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Hand the GPUs back at once."""
        return 0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when nothing else generates or when production lags the trainer."""
        return ctx.only_hybrid or ctx.surplus_samples < 0


class MisnamedPolicy(_Sound):
    """Breaks check_policy_api: its name is not lower_snake_case, so no entry point can match it."""

    name = "Misnamed-Policy"


class RequiredParamPolicy(_Sound):
    """Breaks check_constructible_with_defaults: a param without a default (pass an instance)."""

    name = "required_param"

    class Params(Policy.Params):
        """A tunable the author forgot to give a default."""

        threshold: float = Field(..., ge=0.0, description="fraction of a cycle's samples")


class IgnoresUnknownParamsPolicy(_Sound):
    """Breaks check_params_reject_unknown_keys: it drops keys it does not know, so typos pass."""

    name = "ignores_unknown_params"

    class Params(Policy.Params):
        """One real tunable."""

        floor: float = Field(0.5, ge=0.0, le=1.0, description="fraction of a cycle's samples")

    params: Params

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """Keep only the known keys (the bug)."""
        known = {k: v for k, v in dict(params or {}).items() if k in self.Params.model_fields}
        super().__init__(known)


class IntInsteadOfBoolPolicy(_Sound):
    """Breaks check_decision_types: ``a and b`` returns the int 0 when the cluster has no hybrid replica."""

    name = "int_instead_of_bool"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate when there are active hybrid replicas (returns ``0`` when there are none)."""
        return ctx.num_hybrid_replicas and ctx.is_hybrid_active  # type: ignore[return-value]  # the planted bug


class QueuedSurplusAbandonPolicy(_Sound):
    """Breaks check_decision_types: gives an activation up when the queue holds more than a batch,
    but returns the surplus (an ``int``) where a ``bool`` belongs."""

    name = "queued_surplus_abandon"

    def should_abandon_activation(self, ctx: ScheduleContext) -> bool:
        """Give up when samples beyond the next batch are queued (returns the count: the bug)."""
        return max(0, ctx.queue_size - ctx.step_required_samples)  # type: ignore[return-value]  # the planted bug


class IdleGracePolicy(_Sound):
    """Breaks check_grace_bounds: grants the hybrids the trainer's last wait less the deactivation's
    own cost as a grace, which goes negative once the trainer stopped waiting."""

    name = "idle_grace"

    def deactivate_grace_s(self, ctx: ScheduleContext) -> float:
        """The trainer's waits of the last cycle, less what deactivating takes (forgets to clamp at 0)."""
        return sum(ctx.step_wait_times) - ctx.last_deactivate_duration_s


class WholeBudgetExtraPolicy(_Sound):
    """Breaks check_extra_admission_bounds: admits a whole budget more (a cycle plus the staleness
    buffer) where at most one cycle's batch may go beyond it."""

    name = "whole_budget_extra"

    def admit_extra_samples(self, ctx: ScheduleContext) -> int:
        """Another budget's worth (should have stopped at step_required_samples)."""
        return ctx.step_required_samples + ctx.buffer_samples


class RemainingTokensPolicy(_Sound):
    """Breaks check_request_answers: predicts the tokens still to generate from the siblings' mean,
    which goes negative once the request has generated more than that mean."""

    name = "remaining_tokens"

    def predict_length(self, request: RequestContext) -> float | None:
        """The siblings' mean length less what the request already has (forgets to clamp at 0)."""
        if not request.sibling_lengths:
            return None
        return sum(request.sibling_lengths) / len(request.sibling_lengths) - request.generated_tokens


class FirstStandalonePolicy(_Sound):
    """Breaks check_request_answers: sends resumed requests to a replica id it assumes exists,
    which is not routable in an only-hybrid cluster."""

    name = "first_standalone"

    def route(self, request: RequestContext) -> str | None:
        """Resumed work to ``standalone-0``, the rest by load."""
        return "standalone-0" if request.generated_tokens else None


class RouteWithoutRequestPolicy(_Sound):
    """Breaks check_policy_api: ``route`` takes no request, so the balancer could not call it."""

    name = "route_without_request"

    def route(self) -> str | None:  # type: ignore[override]  # the planted bug
        """Always the built-in choice."""
        return None


class NegativeWaitPolicy(_Sound):
    """Breaks check_wait_bounds: waits for the collection's shortfall, negative when the queue is full."""

    name = "negative_wait"

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Samples still missing for one collection (forgets to clamp at 0)."""
        return ctx.required_samples - ctx.queue_size


class UnboundedWaitPolicy(_Sound):
    """Breaks check_wait_bounds: confuses expected_samples (grows all run) with a cycle's samples."""

    name = "unbounded_wait"

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Half of everything the trainer ever needed (should have been step_required_samples)."""
        return ctx.expected_samples // 2


# A process-global toss counter stands in for a global RNG: like one, it makes an answer depend on
# how many calls came before, but its verdicts are reproducible (every other toss comes up heads),
# whereas real random flips could agree by chance and make the suite's own tests flaky.
_TOSSES = itertools.count()


class CoinFlipPolicy(_Sound):
    """Breaks check_deterministic: "explores" with a process-global coin (every other toss is heads).

    Its answers cannot survive a pickle round trip either, so it also fails check_picklable:
    determinism is its precondition. Whether check_state_dict_json_round_trip sees two different
    answers depends on how many times the process-global coin was tossed before it.
    """

    name = "coin_flip"

    class Params(Policy.Params):
        """Exploration rate."""

        epsilon: float = Field(0.5, ge=0.0, le=1.0, description="explore at all when > 0 (fraction; the coin decides)")

    params: Params

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when behind, or when the global coin says so (epsilon > 0)."""
        heads = next(_TOSSES) % 2 == 0
        return ctx.only_hybrid or ctx.surplus_samples < 0 or (self.params.epsilon > 0 and heads)


class MutatesContextPolicy(_Sound):
    """Breaks check_context_not_mutated: memoises a value on the (frozen) context by the back door."""

    name = "mutates_context"

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Compute the gap once per context and cache it on the context (the bug)."""
        gap = ctx.__dict__.setdefault("_gap", -ctx.surplus_samples)
        return ctx.only_hybrid or gap > 0


class WallClockEmbargoPolicy(_Sound):
    """Breaks check_no_clock_reads: refuses to activate before a wall-clock time (``time.time()``).

    With the default ``not_before_epoch_s`` of 0 every answer equals the sound policy's, so only
    the clock read itself can give it away (the deterministic and round-trip checks pass).
    """

    name = "wall_clock_embargo"

    class Params(Policy.Params):
        """When activation is allowed."""

        not_before_epoch_s: float = Field(0.0, ge=0.0, description="Unix time before which it never activates (s)")

    params: Params

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when behind, once the embargo is over (the bug: the wall clock, not ctx.now)."""
        return ctx.only_hybrid or (ctx.surplus_samples < 0 and time.time() >= self.params.not_before_epoch_s)


class MonotonicGracePolicy(_Sound):
    """Breaks check_no_clock_reads: ``should_deactivate`` asks ``time.monotonic()`` for a grace period."""

    name = "monotonic_grace"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate when active, after a grace period measured on the process's clock (the bug)."""
        return ctx.is_hybrid_active and time.monotonic() >= 0.0


class ClockRateLimitPolicy(_Sound):
    """Breaks check_no_clock_reads and check_decisions_do_not_change_state: the issue's rate limit.

    It stamps ``self.last_activation = time.time()`` inside ``should_activate_after_step`` and saves
    the stamp in ``state_dict``, so the save/restore, pickle and determinism checks all pass.
    """

    name = "clock_rate_limit"

    class Params(Policy.Params):
        """How often it may activate."""

        min_interval_s: float = Field(0.0, ge=0.0, description="least time between activations (s)")

    params: Params

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """No activation yet."""
        super().__init__(params)
        self.last_activation = 0.0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when behind and the last activation is old enough; remember when (both bugs)."""
        now = time.time()
        if ctx.only_hybrid or (ctx.surplus_samples < 0 and now - self.last_activation >= self.params.min_interval_s):
            self.last_activation = now
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """The stamp of the last activation."""
        return {"last_activation": self.last_activation}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the stamp."""
        self.last_activation = float(state["last_activation"])


class GlobalRandomRebalancePolicy(_Sound):
    """Breaks check_no_global_random: rebalances with a probability drawn from ``random.random()``.

    With the default probability of 1 it always answers True, so only the draw from the
    process-global generator (shared with every other library in the process) gives it away.
    """

    name = "global_random_rebalance"

    class Params(Policy.Params):
        """Rebalance probability."""

        rebalance_probability: float = Field(1.0, ge=0.0, le=1.0, description="chance of a rebalance (fraction)")

    params: Params

    def should_rebalance(self, ctx: ScheduleContext) -> bool:
        """Rebalance with the configured probability (the bug: the global generator)."""
        return random.random() < self.params.rebalance_probability


class StepStampingPolicy(_Sound):
    """Breaks check_decisions_do_not_change_state: records the activation step inside the decision.

    A rate limit by steps: activate at most every ``min_gap_steps`` cycles. The stamp is saved in
    ``state_dict`` and is the same on every copy, so the other checks pass; but the runtime may
    replace or skip a decision (timeout, fallback), and the stamp then records an activation that
    did not happen. It belongs in ``update_after_step``.
    """

    name = "step_stamping"

    class Params(Policy.Params):
        """Activation spacing."""

        min_gap_steps: int = Field(1, ge=1, description="least sync cycles between activations (count)")

    params: Params

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """No activation yet."""
        super().__init__(params)
        self.last_activation_step = -(10**9)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when behind and the gap allows; stamp the step (the bug)."""
        if ctx.only_hybrid:
            return True
        if ctx.surplus_samples < 0 and ctx.global_steps - self.last_activation_step >= self.params.min_gap_steps:
            self.last_activation_step = ctx.global_steps
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """The step of the last activation."""
        return {"last_activation_step": self.last_activation_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the step."""
        self.last_activation_step = int(state["last_activation_step"])


class ForgetfulPolicy(_Sound):
    """Breaks check_state_dict_json_round_trip: counts cycles but does not save the count."""

    name = "forgetful"

    class Params(Policy.Params):
        """Warm-up length."""

        warmup_cycles: int = Field(1, ge=0, description="cycles during which it always activates")

    params: Params

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """Start at cycle 0."""
        super().__init__(params)
        self.cycles = 0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Always activate during warm-up, then only when behind."""
        return ctx.only_hybrid or self.cycles < self.params.warmup_cycles or ctx.surplus_samples < 0

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait for one sample once warmed up (0 before).

        Every context after a save shows the lost count here, so the check's verdict does not
        depend on which contexts hypothesis happens to draw.
        """
        return min(self.cycles, 1)

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Count the cycle (state_dict is left as the base class's empty dict: the bug)."""
        self.cycles += 1


class DequeStatePolicy(_Sound):
    """Breaks check_state_dict_json_round_trip: returns a deque from state_dict, which JSON rejects."""

    name = "deque_state"

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """Start with no history."""
        super().__init__(params)
        self.recent: deque[int] = deque(maxlen=3)

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Remember the latest surpluses."""
        self.recent.append(ctx.surplus_samples)

    def state_dict(self) -> dict[str, Any]:
        """The history, as the deque itself (the bug: should be a list)."""
        return {"recent": self.recent}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the history."""
        self.recent = deque(state["recent"], maxlen=3)


class ClampedBacklogPolicy(_Sound):
    """Breaks check_state_dict_json_round_trip: a float estimate clamped to an int bound is saved as
    an int and loaded as a float, so the restored state differs from the saved one.

    The estimate moves only while the trainer keeps waiting, and reaches its bound only after
    several such cycles: generated runs seldom get there, the check's starved edge run does.
    """

    name = "clamped_backlog"

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """Start with no backlog."""
        super().__init__(params)
        self.backlog = 0.0

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when nothing else generates or when production lags by more than the backlog."""
        return ctx.only_hybrid or ctx.surplus_samples < -self.backlog

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Add half the samples the collections waited for, at most a cycle's samples (the bug:
        ``min`` returns the int bound itself once the backlog reaches it)."""
        waited = 0.5 * sum(ctx.step_wait_samples)
        self.backlog = min(ctx.step_required_samples, self.backlog + waited) if waited else 0.0

    def state_dict(self) -> dict[str, Any]:
        """The backlog as it is."""
        return {"backlog": self.backlog}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the backlog as a float."""
        self.backlog = float(state["backlog"])


class QueueFloorPolicy(Policy):
    """Breaks check_only_hybrid_never_deadlocks: the QueueFloor sketch without its only-hybrid guard.

    With no standalone replica and a big enough surplus it answers False after a weight sync, so
    nothing would generate the next cycle's samples.
    """

    name = "queue_floor_unguarded"

    class Params(Policy.Params):
        """Floor of the queue."""

        floor: float = Field(0.5, ge=0.0, le=1.0, description="fraction of a cycle's samples")

    params: Params

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Deactivate whenever hybrid replicas are active."""
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait until the queue holds ``floor`` of a cycle's samples."""
        return int(self.params.floor * ctx.step_required_samples)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate while the surplus is below the floor (never asks whether anything else generates)."""
        surplus = ctx.total_generated_samples - ctx.expected_samples
        return surplus < self.params.floor * ctx.step_required_samples


class LambdaAttributePolicy(_Sound):
    """Breaks check_picklable: keeps a lambda on self, which pickle cannot serialise."""

    name = "lambda_attribute"

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        """Store the scoring function as a lambda (the bug)."""
        super().__init__(params)
        self.score = lambda ctx: -ctx.surplus_samples

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Activate when the score is positive."""
        return ctx.only_hybrid or self.score(ctx) > 0


class SlowPolicy(_Sound):
    """Breaks check_decision_latency: sleeps 3 ms per activation decision (stands in for I/O)."""

    name = "slow"

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Ask a "remote service" (a sleep) before answering."""
        time.sleep(0.003)
        return super().should_activate_after_step(ctx)


class SlowRouterPolicy(_Sound):
    """Breaks check_decision_latency: asks a "remote service" (a 1 ms sleep) for every request's replica."""

    name = "slow_router"

    def route(self, request: RequestContext) -> str | None:
        """The built-in choice, after a lookup that stands in for I/O."""
        time.sleep(0.001)
        return None


class AlarmGuardedPolicy(_Sound):
    """Breaks check_e2e_training_finishes: guards its decision with SIGALRM, which needs the main thread.

    Every unit check calls it on the main thread, where it works; the runtime calls policies from
    a worker thread, where ``signal.signal`` raises, so each activation decision falls back.
    """

    name = "alarm_guarded"

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Answer under a 1-second alarm (the bug: signals only work in the main thread)."""
        previous = signal.signal(signal.SIGALRM, _too_slow)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        try:
            return super().should_activate_after_step(ctx)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            signal.signal(signal.SIGALRM, previous)


def _too_slow(signum: int, frame: Any) -> None:
    raise TimeoutError("policy decision took longer than 1 s")


class SampleDroppingPolicy(_Sound):
    """Breaks check_e2e_samples_accounted: reaches into the runtime and drops a queued sample.

    A policy that keeps to the API cannot lose a sample (the runtime owns them all), so this one
    breaks the API's first rule instead: from the runtime's worker thread, it finds the message
    queue through the rollouter's running task and discards a sample, once per cycle. It stands in for
    any defect, in a policy or in the runtime, that loses work during a run.
    """

    name = "sample_dropping"

    def update_after_step(self, ctx: ScheduleContext) -> None:
        """Drop one queued sample, when called from inside a run (the sabotage)."""
        if threading.current_thread() is threading.main_thread():
            return  # not inside the runtime: behave
        # Not through gc.get_objects(): the runtime freezes its start-up objects (the queue
        # among them) for the run, and frozen objects are not listed there.
        for _ in range(3):
            try:
                # Private set: asyncio.all_tasks() must run on the loop's own thread, and this is a
                # worker thread; the loop thread may add a task meanwhile (RuntimeError, retried).
                tasks: list[Any] = list(vars(asyncio.tasks)["_all_tasks"])
            except RuntimeError:
                continue
            for task in tasks:
                frame = getattr(task.get_coro(), "cr_frame", None)
                owner = frame.f_locals.get("self") if frame is not None else None
                queue: Any = getattr(owner, "queue", None)
                if type(queue).__name__ == "MessageQueue" and getattr(queue, "_items", None):
                    sample = queue._items.pop()
                    queue._forget_version(sample.start_version)
                    return
            return


class HoardingPolicy(_Sound):
    """Breaks check_e2e_not_slower_than_baseline: always activates, then waits for a full cycle.

    Each answer is valid (the wait is exactly the largest allowed, step_required + buffer), but
    training cannot start until a whole cycle's samples are queued, so generation and training
    stop overlapping and the run is far slower than plain fully-async training.
    """

    name = "hoarding"

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Wait for everything the queue can hold."""
        return ctx.step_required_samples + ctx.buffer_samples

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Always lend the trainer's GPUs."""
        return True


BROKEN_POLICIES: dict[str, list[tuple[Any, str]]] = {
    "check_policy_api": [
        (MisnamedPolicy, "name='Misnamed-Policy'"),
        (RouteWithoutRequestPolicy, "route(self) has the wrong signature"),
    ],
    "check_constructible_with_defaults": [
        (RequiredParamPolicy({"threshold": 0.5}), "RequiredParamPolicy() raised PolicyParamsError"),
    ],
    "check_params_reject_unknown_keys": [(IgnoresUnknownParamsPolicy, "was accepted")],
    "check_decision_types": [
        (IntInsteadOfBoolPolicy, "should_deactivate returned 0 of type int; expected bool"),
        (QueuedSurplusAbandonPolicy, "should_abandon_activation returned"),
    ],
    "check_grace_bounds": [(IdleGracePolicy, "deactivate_grace_s returned -")],
    "check_extra_admission_bounds": [(WholeBudgetExtraPolicy, "more than one cycle's batch beyond")],
    "check_request_answers": [
        (RemainingTokensPolicy, "predict_length returned -"),
        (FirstStandalonePolicy, "route returned 'standalone-0', which is not routable now"),
    ],
    "check_wait_bounds": [
        (NegativeWaitPolicy, "deactivate_wait_samples returned -"),
        (UnboundedWaitPolicy, "the queue never holds more than a cycle's samples"),
    ],
    "check_deterministic": [(CoinFlipPolicy, "for the same context and equal state")],
    "check_context_not_mutated": [(MutatesContextPolicy, "should_activate_after_step changed the context (_gap")],
    "check_decisions_do_not_change_state": [
        (StepStampingPolicy, "should_activate_after_step changed the policy's state (self.last_activation_step:"),
        (ClockRateLimitPolicy, "should_activate_after_step changed the policy's state (self.last_activation:"),
    ],
    "check_no_clock_reads": [
        (WallClockEmbargoPolicy, "should_activate_after_step called time.time(); a policy must not read a clock"),
        (MonotonicGracePolicy, "should_deactivate called time.monotonic()"),
        (ClockRateLimitPolicy, "should_activate_after_step called time.time()"),
    ],
    "check_no_global_random": [
        (GlobalRandomRebalancePolicy, "should_rebalance called random.random() (the process-global generator)"),
    ],
    "check_state_dict_json_round_trip": [
        (ForgetfulPolicy, "on a fresh instance restored from its state_dict"),
        (DequeStatePolicy, "is not JSON-serialisable"),
        (ClampedBacklogPolicy, "(state.backlog: 16 -> 16.0, saved -> restored)"),
    ],
    "check_only_hybrid_never_deadlocks": [
        (QueueFloorPolicy, "should_activate_after_step returned False in an only-hybrid")
    ],
    "check_picklable": [(LambdaAttributePolicy, "pickle round trip failed")],
    "check_decision_latency": [
        (SlowPolicy, "should_activate_after_step took a median"),
        (SlowRouterPolicy, "route took a median"),
    ],
    "check_e2e_training_finishes": [
        (
            AlarmGuardedPolicy,
            "should_activate_after_step at step 0: raised ValueError: signal only works in main thread",
        ),
    ],
    "check_e2e_samples_accounted": [(SampleDroppingPolicy, "unaccounted")],
    "check_e2e_not_slower_than_baseline": [(HoardingPolicy, "expected at most 10% slower")],
}
"""Check name -> [(policy that must fail it, text its failure message must contain)]."""
