"""Hook specifications of dynres: the plugin author's reference.

Two kinds of hooks live here.

**Decision hooks** (``firstresult``, except ``dynres_update_after_step``, where every
implementation runs). Each mirrors one method of :class:`dynres.core.Policy` and is
called by the controller once per sync cycle, in this order:

1. ``dynres_should_deactivate`` - before training;
2. ``dynres_deactivate_wait_samples`` - only if (1) said yes;
3. ``dynres_deactivate_grace_s`` - only if (1) said yes (the dynres runtime only: verl never asks);
4. ``dynres_should_activate_after_step`` - after the weight sync;
5. ``dynres_should_abandon_activation`` - during an activation (4) once the next collection's
   samples are queued, at most once, and only when the policy writes it or a plugin implements
   it (the dynres runtime only: verl never asks);
6. ``dynres_should_rebalance`` - only after an activation, and only when
   ``dynamic_schedule_enable_rebalance`` is on;
7. ``dynres_admit_extra_samples`` - after the weight sync, unless it was the run's last (the
   dynres runtime only: verl never asks);
8. ``dynres_update_after_step`` - after the weight sync.

The active policy is registered as the ``trylast`` implementation of each decision hook, so a
plugin can override a decision by returning a non-``None`` value, or wrap it with
``@hookimpl(wrapper=True)`` to observe or change the policy's answer. A policy author who subclasses
``Policy`` writes plain methods and never touches these hooks.

Whatever the hooks return (the policy's answer or a plugin's override) is checked before the
runtime acts on it: against the table of valid answers, :data:`dynres.core.answers.ANSWERS`
(type and range, numpy scalars normalised), then through the safety clamps and fallbacks of
the policy guard, :mod:`dynres.core.guard` (the runtime's decision guard and dynres-verl's use it).

**Request decision hooks** (``firstresult``): ``dynres_predict_length`` and
``dynres_route_request`` mirror the policy's per-request methods ``predict_length`` and ``route``
(:mod:`dynres.core.requests`). The load balancer asks them for each request that has no valid
sticky replica, inline on the event loop, and only when the policy writes one of the methods or a
plugin implements one of the hooks; otherwise routing is the built-in least-in-flight rule and no
hook is called. As with the decision hooks, the policy's method is the ``trylast``
implementation, so a plugin returning non-``None`` overrides it.

**Observer hooks** (all implementations are called, results ignored): a decision was made, the
controller changed state, metrics were emitted. Use them for exporters and logging.

**Tracking hook** (all implementations are called, their lists pooled):
``dynres_tracking_backends`` offers the backends verl's ``trainer.logger`` key can name
(:mod:`dynres.core.tracking`).

**Resolution hook** (``firstresult``): ``dynres_resolve_policy`` lets a plugin answer for policy
names the built-in resolver cannot place (dynres-verl answers ``verl:<name>``).

Plugins are discovered through the ``dynres.plugins`` entry-point group (set the environment
variable ``DYNRES_DISABLE_PLUGIN_AUTOLOAD=1`` to skip that) or registered by hand on a manager
from :func:`dynres.core.get_plugin_manager`. Hook arguments are passed by keyword; an
implementation may accept any subset of a spec's arguments, and pluggy rejects any other name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from dynres.core.context import ScheduleContext
    from dynres.core.policy import Policy
    from dynres.core.requests import RequestContext
    from dynres.core.tracking import TrackingBackend

PROJECT_NAME = "dynres"
"""The pluggy project name shared by the markers and the plugin manager."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marker for the specifications below."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marker a plugin puts on each of its hook implementations."""


# ---- Decision hooks ------------------------------------------------------------------------


@hookspec(firstresult=True)
def dynres_should_deactivate(ctx: ScheduleContext) -> bool | None:
    """Decide, before a training step, whether to hand the hybrid replicas back to the trainer.

    Called once per sync cycle before the first collection. Returning ``True`` makes the
    controller wait for :func:`dynres_deactivate_wait_samples` samples and then deactivate the
    hybrid replicas (remove from routing, abort, sleep). Return ``None`` to let the next
    implementation (ultimately the policy) decide.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: ``True`` to deactivate, ``False`` to keep hybrid replicas generating, or ``None``.
    """


@hookspec(firstresult=True)
def dynres_deactivate_wait_samples(ctx: ScheduleContext) -> int | None:
    """Return how many queued samples to wait for before deactivating the hybrid replicas.

    Called only when :func:`dynres_should_deactivate` returned ``True``. The trainer loop waits
    until the message queue holds at least this many samples (or all the run still needs), then
    the controller deactivates. ``0`` deactivates at once. The policy guard
    (:mod:`dynres.core.guard`) clamps the answer to ``[0, step_required_samples +
    buffer_samples]``, and to at least ``step_required_samples`` in an only-hybrid cluster.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: a sample count ``>= 0``, or ``None`` to defer to the next implementation.
    """


@hookspec(firstresult=True)
def dynres_deactivate_grace_s(ctx: ScheduleContext) -> float | None:
    """Return how long the requests still running on the hybrid replicas may go on once they leave routing.

    Called right after :func:`dynres_deactivate_wait_samples`, by the dynres runtime only (verl's
    trainer has no such step: its deactivation aborts at once). The controller removes the hybrid
    replicas from routing, waits up to this many seconds for their running requests to finish,
    then aborts the rest (retried elsewhere with their partial output) and puts them to sleep.
    The policy guard clamps the answer to ``[0, last_cycle_time_s]``.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: seconds ``>= 0`` (``0.0`` aborts at once), or ``None`` to defer.
    """


@hookspec(firstresult=True)
def dynres_should_activate_after_step(ctx: ScheduleContext) -> bool | None:
    """Decide, after the weight sync, whether the hybrid replicas generate during the next cycle.

    When the answer is ``True`` the controller also syncs weights to the hybrid replicas and
    activates them (register in the balancer, then resume); when it is ``False`` the hybrid
    replicas stay asleep and their weight sync is skipped.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: ``True`` to activate, ``False`` to stay standalone-only, or ``None``.
    """


@hookspec(firstresult=True)
def dynres_should_rebalance(ctx: ScheduleContext) -> bool | None:
    """Decide, right after an activation, whether to move queued work onto the new replicas.

    Only asked when ``dynamic_schedule_enable_rebalance`` is on. The controller performs the
    rebalance (it clears sticky entries and moves only the requests that should move); a policy
    or plugin never does I/O here.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: ``True`` to rebalance, ``False`` not to, or ``None``.
    """


@hookspec(firstresult=True)
def dynres_should_abandon_activation(ctx: ScheduleContext) -> bool | None:
    """Decide whether to give up an activation whose purpose is gone: the next collection's samples
    are already queued, so the trainer could train now, and finishing the activation would make it
    wait for the rest of the switch and then for the deactivation before training.

    Asked by the dynres runtime only (verl's trainer activates in one call it cannot stop), at most
    once per activation the policy asked for, at the first point between the activation's phases
    (after the trainer's offload, after the hybrids' weight wake-up, after their weight load) at
    which the queue holds the next collection's ``required_samples``, and only when the policy writes
    ``should_abandon_activation`` or a plugin implements this hook. Giving up puts the woken hybrids
    back to sleep and onloads the trainer; what was spent is lost. The activation the runtime starts
    because nothing else can generate is never offered. The context is taken when asked.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: ``True`` to give the activation up, ``False`` to finish it, or ``None``.
    """


@hookspec(firstresult=True)
def dynres_admit_extra_samples(ctx: ScheduleContext) -> int | None:
    """Return how many samples the rollouter may admit under the new weights beyond the staleness budget.

    Called after the activation decisions of each weight sync but the run's last, by the dynres
    runtime only (verl's rollouter has no such step). The budget lets production run
    ``staleness_threshold`` cycles ahead: ``max_required_samples`` samples per weight version.
    Once they are admitted, this many more may start, typically near the cycle's end, when the
    replicas would otherwise idle beside the cycle's longest responses. Each is trained up to one
    cycle staler than the threshold allows; the queue drops any sample past its staleness limit,
    as always. The answer holds until the next weight sync. The policy guard clamps it to
    ``[0, step_required_samples]``.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    :return: a sample count ``>= 0`` (``0`` keeps the budget as it is), or ``None`` to defer.
    """


@hookspec
def dynres_update_after_step(ctx: ScheduleContext) -> None:
    """Let the policy adapt its state after the weight sync of a cycle.

    Not ``firstresult``: every implementation runs, whatever the others return, so a plugin
    observing the end of a cycle can never stop the policy from adapting. Implementations
    return ``None``.

    :param ctx: the current :class:`~dynres.core.context.ScheduleContext`.
    """


# ---- Request decision hooks ----------------------------------------------------------------


@hookspec(firstresult=True)
def dynres_predict_length(request: RequestContext) -> float | None:
    """Predict how many tokens the response of a request being routed will have in all.

    Asked before :func:`dynres_route_request`, whose context carries the answer as
    ``predicted_tokens``. The context has what the runtime knows: the prompt's length, the tokens
    earlier attempts generated, and the lengths of the sample's finished sibling responses.
    Must be fast (microseconds) and do no I/O: it runs on the event loop for every such routing.

    :param request: the :class:`~dynres.core.requests.RequestContext` of the request.
    :return: a finite number of tokens ``>= 0``, or ``None`` for no prediction (or to defer to
        the next implementation). Anything else is a fallback to ``None``, warned once and counted.
    """


@hookspec(firstresult=True)
def dynres_route_request(request: RequestContext) -> str | None:
    """Choose the replica a request without a valid sticky replica goes to.

    For example short responses to hybrid replicas, which the next deactivation aborts, and long
    ones to standalone replicas. Must be fast and do no I/O (see :func:`dynres_predict_length`).

    :param request: the :class:`~dynres.core.requests.RequestContext`, with ``replicas`` (each
        routable replica's id, kind and requests in flight) and ``predicted_tokens``.
    :return: one of ``request.replicas``' ids, or ``None`` for the built-in rule (least in
        flight, seeded tie-break) or to defer. Anything else is a fallback to ``None``, warned
        once and counted.
    """


# ---- Observer hooks ------------------------------------------------------------------------


@hookspec
def dynres_decision_made(decision: str, value: Any, ctx: ScheduleContext, policy_name: str, fallback: bool) -> None:
    """Observe one decision after the policy guard checked and clamped it (:mod:`dynres.core.guard`).

    :param decision: the policy method's name, e.g. ``"should_deactivate"``.
    :param value: the value the runtime acts on (after fallback and clamps).
    :param ctx: the context the decision was made with.
    :param policy_name: the active policy's ``name``.
    :param fallback: ``True`` when the policy raised, hung or returned a wrong type and the
        runtime used the safe value instead.
    """


@hookspec
def dynres_state_transition(old_state: str, new_state: str, now: float) -> None:
    """Observe a controller state change (e.g. ``STANDALONE_ONLY -> ACTIVATING``).

    :param old_state: name of the state left.
    :param new_state: name of the state entered.
    :param now: the run's clock, in seconds.
    """


@hookspec
def dynres_metrics_emitted(step: int, metrics: dict[str, float]) -> None:
    """Observe the metrics of one sync cycle (the ``dynamic_resource/*`` keys and others).

    :param step: the sync cycle's ``global_steps`` value after the cycle.
    :param metrics: metric key to value; units as documented per key.
    """


# ---- Tracking hook -------------------------------------------------------------------------


@hookspec
def dynres_tracking_backends() -> list[TrackingBackend] | None:
    """Offer tracking backends that verl's ``trainer.logger`` key can name.

    Called once per run, before anything starts; every implementation runs and the backends of
    all of them are pooled (dynres-runtime's own ``console``, ``file``, ``tensorboard``, ``mlflow``
    and ``wandb`` come through this same hook, each from an entry point of the ``dynres.plugins``
    group). A name offered by two plugins is an error naming both. A backend only describes
    itself here: nothing is imported or opened until a run lists its name, and then
    :meth:`~dynres.core.tracking.TrackingBackend.check` runs first, so a missing package stops the
    run before it starts with one line naming what to install. See :mod:`dynres.core.tracking`.

    :return: a list of :class:`~dynres.core.tracking.TrackingBackend` instances (empty or ``None``:
        nothing to offer).
    """


# ---- Resolution hook -----------------------------------------------------------------------


@hookspec(firstresult=True)
def dynres_resolve_policy(name: str) -> type[Policy] | None:
    """Return the policy class for a name that only a plugin knows, or ``None`` to pass.

    :func:`dynres.core.loading.resolve_policy_class` (the one resolver behind ``--policy``,
    ``dynamic_schedule_policy`` and ``pytest --dynres-policy``) calls this before it reads a name
    as ``module:Class`` or looks it up in the ``dynres.policies`` entry points, so a plugin can
    claim a prefix of its own (dynres-verl claims ``verl:<name>``). Return ``None`` for names
    the plugin does not own; raise a :class:`dynres.core.errors.PolicyError` with a one-line
    message naming the fix when the name is the plugin's but cannot be resolved. The returned
    class is validated like any other policy class.

    :param name: the policy name as the user wrote it, stripped of surrounding spaces.
    :return: a :class:`~dynres.core.policy.Policy` subclass, or ``None``.
    """


DECISION_HOOKS: tuple[str, ...] = (
    "dynres_should_deactivate",
    "dynres_deactivate_wait_samples",
    "dynres_deactivate_grace_s",
    "dynres_should_activate_after_step",
    "dynres_should_abandon_activation",
    "dynres_should_rebalance",
    "dynres_admit_extra_samples",
    "dynres_update_after_step",
)
"""Names of the decision hooks, in the order the controller calls them in a cycle."""

REQUEST_HOOKS: tuple[str, ...] = ("dynres_predict_length", "dynres_route_request")
"""Names of the per-request decision hooks, in the order the load balancer calls them."""

OBSERVER_HOOKS: tuple[str, ...] = (
    "dynres_decision_made",
    "dynres_state_transition",
    "dynres_metrics_emitted",
)
"""Names of the observer hooks."""

RESOLUTION_HOOKS: tuple[str, ...] = ("dynres_resolve_policy",)
"""Names of the hooks the policy resolver consults."""

TRACKING_HOOKS: tuple[str, ...] = ("dynres_tracking_backends",)
"""Names of the hooks that offer tracking backends (``trainer.logger``)."""
