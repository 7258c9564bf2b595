"""A simulated run as verl's fully-async trainer drives it: verl's own controller and policies, dynres's engines.

``dynres simulate --host verl`` answers "what would this policy do inside my verl run?". The policy
is named as a verl config names it (``dynres:predictive`` through the dynres-verl bridge, or one of
verl's own, ``default``) and built by verl's ``build_policy``. verl 0.9.1's
``DynamicResourceController`` runs unmodified, and :class:`VerlTrainerLoop` calls it and the policy
in the order of verl's ``FullyAsyncTrainer``:

* at the start of every fit step, ``should_deactivate``; if yes, ``deactivate_wait_samples``, the
  rollouter's ``wait_for_enough_samples`` (polling the queue every second, as verl does) and the
  controller's ``deactivate_hybrid_replicas``; the fit step then trains. verl's trainer would train
  beside hybrid replicas its policy kept; a simulated trainer cannot (their GPUs are its own), so
  those, and any the simulator's safety net woke because nothing else could produce a collection,
  are deactivated first, through verl's controller;
* after the cycle's last fit step, verl's weight update: the context's counters are refreshed
  from the rollouter (``expected_samples`` counts its completed steps, which start at 1),
  ``should_activate_after_step`` is asked *before* the weight sync, then the standalone replicas
  are synced, the controller's ``sync_hybrid_weights`` and ``activate_hybrid_replicas`` run, the
  policy's ``request_rebalance`` (with ``dynamic_schedule_enable_rebalance``), the rollouter's
  staleness reset, and ``update_after_step``; the cycle's switch times are then reset;
* before the first cycle the same weight update runs once at version 0 (verl's "param sync
  before fit").

What stands in for verl's Ray actors, backed by the simulated run: :class:`VerlRolloutStandIn` for
the rollouter (its counters, replica lists, hybrid add/remove stamps and statistics, as verl's own
methods return them) and :class:`VerlCheckpointStandIn` for the hybrid checkpoint manager. verl's
controller reaches the rollouter through ``.remote()`` calls and ``ray.get``; for the length of a
run, the ``ray`` name of verl's dynamic-schedule modules is a shim whose ``get`` returns the
stand-ins' plain answers (:func:`verl_without_ray`). verl's code itself is not changed.

What the stand-ins do is dynres's: a transition is carried out by the dynres controller, whole, at
the first call of verl's sequence that needs it (``remove_replicas`` deactivates: routing cut,
abort and drain, sleep, trainer onload; the checkpoint manager's ``update_weights`` activates:
trainer offload, wake, load, routing, resume), and the calls after it in the same sequence find it
done. The weight sync, the rebalance (only the excess moves, where verl's aborts every replica) and
the staleness budget are the dynres runtime's. So a difference between this host and
``dynres simulate`` comes from verl's controller, call order and context, not from the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import os
import pkgutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dynres.core import Policy, ScheduleContext
from dynres.core.errors import PolicyImportError, PolicyNotFoundError
from dynres.runtime.loop.cycle import TrainerLoop, _Cycle
from dynres.runtime.loop.decisions import DecisionRecord
from dynres.runtime.protocols import WeightUpdate

SCHEDULE_PACKAGE = "verl.experimental.fully_async_policy.dynamic_schedule"
"""verl's package with the policy registry, the context dataclass and the controller."""


@dataclass(frozen=True)
class VerlTiming:
    """The two places verl's trainer times things differently from the dynres runtime.

    With :data:`DYNRES_TIMING` the verl host makes exactly the decisions of the dynres runtime for
    the same policy (what its tests check, so that everything else, the controller, the call order
    and the context, is shown to be faithful); with :data:`VERL_TIMING` (the default) it is what
    verl 0.9.1 does.
    """

    wait_poll_s: float | None = 1.0
    """How often the trainer's wait for a deactivation target looks at the queue (seconds; None: it
    ends the moment the queue holds the target, as in the dynres runtime)."""
    reset_after_activation: bool = True
    """The staleness budget is reset after the hybrid activation (verl) rather than right after the
    standalone sync (the dynres runtime), so nothing new is admitted while the hybrids wake up."""


VERL_TIMING = VerlTiming()
"""verl 0.9.1's trainer: a 1 s queue poll, the staleness reset after the activation."""

DYNRES_TIMING = VerlTiming(wait_poll_s=None, reset_after_activation=False)
"""The dynres runtime's timing, with everything else verl's."""

PARAMS_ENV = "DYNRES_VERL_PARAMS"
"""The environment variable dynres-verl reads a dynres policy's params from (docs/verl.md)."""

BRIDGE_PREFIX = "dynres:"
"""How verl's registry names a dynres policy."""

OWN_PREFIX = "verl:"
"""How dynres names one of verl's own policies; inside verl it is the bare name."""


def _schedule_module() -> Any:
    try:
        return importlib.import_module(SCHEDULE_PACKAGE)
    except Exception as exc:  # verl missing, or its own imports failing
        raise PolicyImportError(
            f"--host verl needs verl's dynamic-schedule module ({type(exc).__name__}: {exc}); "
            "install verl 0.9.x and dynres-verl (`pip install dynres-verl`)"
        ) from exc


class _RayShim:
    """verl's ``ray`` name during a simulated run: ``get`` returns the stand-ins' plain answers."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def get(self, refs: Any, timeout: float | None = None) -> Any:
        """The stand-ins answer with plain values (and lists of them): return them as they are."""
        return refs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def verl_without_ray() -> Iterator[None]:
    """For the block's length, verl's dynamic-schedule modules see :class:`_RayShim` as ``ray``."""
    pkg = _schedule_module()
    patched: list[tuple[Any, Any]] = []
    for info in pkgutil.iter_modules(pkg.__path__, prefix=pkg.__name__ + "."):
        mod = importlib.import_module(info.name)
        real = getattr(mod, "ray", None)
        if real is not None and not isinstance(real, _RayShim):
            patched.append((mod, real))
            setattr(mod, "ray", _RayShim(real))  # noqa: B010  (a module's global, set by name: mypy cannot type it)
    try:
        yield
    finally:
        for mod, real in patched:
            setattr(mod, "ray", real)  # noqa: B010  (as above)


class _Remote:
    """One stand-in method as a Ray actor method: ``.remote(...)`` calls it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the method; an async one returns its coroutine, for verl's ``await``."""
        return self._fn(*args, **kwargs)


class ActorHandle:
    """A stand-in behind Ray's actor-handle syntax (``handle.method.remote(...)``)."""

    def __init__(self, target: Any) -> None:
        """Expose ``target``'s public methods as actor methods."""
        self._target = target

    def __getattr__(self, name: str) -> _Remote:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Remote(getattr(self._target, name))


class VerlRolloutStandIn:
    """verl's ``FullyAsyncRollouter`` as its controller and policies call it, backed by the simulated run."""

    def __init__(self, loop: VerlTrainerLoop, total_steps: int) -> None:
        """Answer for ``loop``'s run of ``total_steps`` sync cycles."""
        self.loop = loop
        """The trainer loop whose run this rollouter reports on."""
        self.total_steps = total_steps
        """Sync cycles of the run (verl's ``total_train_steps``)."""
        self.completed_steps = 1
        """verl's count of weight versions that generated something; it starts at 1 in verl 0.9.1."""
        self.added_at = 0.0
        """Run-clock time hybrid replicas last became routable (seconds; 0 = never)."""
        self.removed_at = 0.0
        """Run-clock time they last left routing (seconds; 0 = never)."""
        self.moved = 0
        """Requests the latest rebalance moved (count)."""
        self._generated_at_reset = 0
        self._pending: list[asyncio.Task[int]] = []

    # ---- what verl's controller, trainer and policies read ----------------------------------

    def get_standalone_replicas(self) -> list[Any]:
        """The standalone replicas."""
        return list(self.loop.wiring.standalone)

    def get_all_hybrid_replicas(self) -> dict[str, Any]:
        """Hybrid replica id -> replica, asleep or active."""
        return {r.replica_id: r for r in self.loop.wiring.controller.hybrid}

    def get_total_train_steps(self) -> int:
        """The run's sync cycles."""
        return self.total_steps

    def get_total_produced_samples(self) -> int:
        """Samples generated since training began."""
        return self.loop.wiring.rollouter.generated

    def get_completed_steps(self) -> int:
        """Weight versions that generated something (see :attr:`completed_steps`)."""
        return self.completed_steps

    def get_hybrid_statistics(self) -> dict[str, Any]:
        """verl's statistics dict, the keys it has in verl 0.9.1, from the simulated run."""
        w = self.loop.wiring
        return {
            "monitor/active_tasks_size": w.rollouter.in_flight,
            "monitor/queue/mq_queue_size": w.queue.size,
            "count/total_generated_samples": w.rollouter.generated,
            "count/dropped_stale_samples": w.queue.dropped_stale,
            "static/required_samples": w.tracker.required_samples,
            "hybrid/num_hybrid_replicas": len(w.controller.active),
            "hybrid/last_add_time": self.added_at,
            "hybrid/last_remove_time": self.removed_at,
        }

    # ---- what verl's controller and policies do ---------------------------------------------

    async def add_replicas(self, resource_ids: list[str]) -> int:
        """Make the hybrid replicas routable; those already routable are skipped, as verl's do."""
        controller = self.loop.wiring.controller
        if not controller.is_hybrid_active:
            await self.loop.activate_hybrids()
        return len(controller.active) if controller.is_hybrid_active else 0

    async def remove_replicas(self, resource_ids: list[str]) -> int:
        """Take the hybrid replicas out of routing: the dynres deactivation, whole (see module doc)."""
        w = self.loop.wiring
        if not w.controller.is_hybrid_active:
            return 0
        n = len(w.controller.active)
        self.removed_at = w.now()
        w.tracker.hybrid_stopping()
        await w.controller.deactivate()
        return n

    def rebalance_requests(self) -> dict[str, Any]:
        """Start the dynres rebalance; the trainer waits for it (:meth:`settle`), as verl's ``ray.get`` does."""
        controller = self.loop.wiring.controller
        if controller.is_hybrid_active:
            self._pending.append(asyncio.ensure_future(controller.rebalance()))
        return {"cleared_entries": 0, "server_loads": self.loop.wiring.balancer.in_flight_counts()}

    async def settle(self) -> None:
        """Wait for the work verl's blocking calls started (a rebalance); record what it moved."""
        pending, self._pending = self._pending, []
        for task in pending:
            self.moved += await task

    async def wait_for_enough_samples(self, required_count: int) -> int:
        """Return once the queue holds ``required_count`` samples, looking every ``timing.wait_poll_s``.

        The simulator's runs admit only what their cycles consume, so near the end the queue may
        never reach a target: the wait also ends when nothing more can arrive (the dynres
        runtime's own rule), where verl's rollouter would go on generating for later epochs.
        """
        w = self.loop.wiring

        def enough() -> bool:
            return w.queue.size >= required_count or w.rollouter.finished() or w.rollouter.demand_queued()

        poll = self.loop.timing.wait_poll_s
        if poll is None:
            await w.queue.wait_until(enough)
        while not enough():
            await asyncio.sleep(poll or 0.0)
        return w.queue.size

    def reset_staleness(self) -> None:
        """verl's staleness reset: a version that generated something counts as a completed step."""
        generated = self.loop.wiring.rollouter.generated
        if generated > self._generated_at_reset:
            self.completed_steps += 1
        self._generated_at_reset = generated


class VerlCheckpointStandIn:
    """verl's hybrid ``CheckpointEngineManager`` as its controller calls it, backed by the simulated run."""

    def __init__(self, loop: VerlTrainerLoop) -> None:
        """Carry out ``loop``'s hybrid transitions."""
        self.loop = loop
        """The trainer loop whose hybrid replicas this manages."""

    @property
    def replicas(self) -> list[str]:
        """Ids of the hybrid replicas registered with the manager."""
        return [r.replica_id for r in self.loop.wiring.controller.hybrid]

    async def abort_replicas(self) -> None:
        """verl aborts before loading weights and after cutting routing: the dynres transitions already did."""

    async def update_weights(self, global_steps: int = 0) -> None:
        """Load the latest weights into the hybrid replicas: the dynres activation, whole (see module doc)."""
        if not self.loop.wiring.controller.is_hybrid_active:
            await self.loop.activate_hybrids()

    async def resume_generation_replicas(self) -> None:
        """The dynres activation resumed them already."""

    async def sleep_replicas(self) -> None:
        """The dynres deactivation put them to sleep already."""


class VerlTrainerLoop(TrainerLoop):
    """The trainer side of a verl run: verl's controller and policy called in its trainer's order."""

    def __init__(
        self,
        *args: Any,
        verl_policy: str,
        total_steps: int,
        deactivate_ratio: float | None = None,
        policy_params: Mapping[str, Any] | None = None,
        timing: VerlTiming = VERL_TIMING,
        **kwargs: Any,
    ) -> None:
        """Build the dynres trainer loop, then verl's policy ``verl_policy`` and controller around it.

        ``deactivate_ratio`` is verl's ``dynamic_schedule_deactivate_ratio``; ``policy_params`` reach
        a dynres policy as dynres-verl reads them; ``timing`` says whose timing the trainer keeps.
        Other arguments are :class:`TrainerLoop`'s.
        """
        super().__init__(*args, **kwargs)
        self.timing = timing
        """verl's trainer timing, or the dynres runtime's (see :class:`VerlTiming`)."""
        mod = _schedule_module()
        w = self.wiring
        self.rollouter_standin = VerlRolloutStandIn(self, total_steps)
        """verl's rollouter, as the controller and policies see it."""
        self.checkpoint_standin = VerlCheckpointStandIn(self)
        """verl's hybrid checkpoint manager, as the controller sees it."""
        only_hybrid = not w.standalone
        self.verl_ctx = mod.DynamicScheduleContext(
            required_samples=w.tracker.required_samples,
            trigger_parameter_sync_step=w.tracker.trigger_parameter_sync_step,
            total_generated_samples=0,
            expected_samples=0,
            buffer_samples=0,
            only_hybrid=only_hybrid,
        )
        """The context verl's trainer keeps and hands to every policy call."""
        self.verl_controller = mod.DynamicResourceController(
            rollouter=ActorHandle(self.rollouter_standin),
            hybrid_checkpoint_manager=self.checkpoint_standin,
            num_standalone_replicas=len(w.standalone),
            num_hybrid_replicas=len(w.controller.hybrid),
            policy=build_verl_policy(
                verl_policy, only_hybrid=only_hybrid, ratio=deactivate_ratio, params=policy_params
            ),
        )
        """verl's DynamicResourceController, unmodified."""
        use_clock = getattr(self.policy, "use_clock", None)
        if callable(use_clock):
            use_clock(w.now)  # a dynres policy's reader compares the stand-in's stamps with its clock
        self._waits: list[float] = []
        self._wait_samples: list[int] = []
        self._records: list[DecisionRecord] = []

    @property
    def policy(self) -> Any:
        """verl's policy object (one of verl's own classes, or a dynres policy's adapter)."""
        return self.verl_controller.policy

    # ---- verl's trainer order ---------------------------------------------------------------

    async def startup(self) -> list[DecisionRecord]:
        """verl's "param sync before fit": the weight update at version 0."""
        c = self._new_cycle()
        await self._update_weights(c, new_version=False)
        return c.decisions

    async def cycle(self) -> Any:
        """One sync cycle in verl's order; return its CycleReport."""
        c = self._new_cycle()
        for i in range(self.wiring.tracker.trigger_parameter_sync_step):
            await self._fit_step_start(c)
            await self._collect_one(c, i)
            self._waits.append(c.collections[-1].wait_s)
            self._wait_samples.append(c.collections[-1].wait_samples)
        window = await self._update_weights(c, new_version=True)
        assert window is not None
        return self._report(c, window, decided_s=self.wiring.now())

    async def activate_hybrids(self) -> None:
        """The dynres activation with the latest weights (called by the stand-ins)."""
        w = self.wiring
        if self.last_update is None or not w.controller.usable_hybrid:
            return
        if await w.controller.activate(self.last_update):
            w.tracker.hybrid_started()
            self.rollouter_standin.added_at = w.now()

    def _new_cycle(self) -> _Cycle:
        w = self.wiring
        return _Cycle(
            start_s=w.now(),
            hybrid_at_start=w.controller.is_hybrid_active,
            deactivations_before=w.controller.deactivations,
            dropped_before=w.queue.dropped_stale,
            generated_before=w.rollouter.generated,
        )

    async def _fit_step_start(self, c: _Cycle) -> None:
        """verl's fit step start: ``should_deactivate``, then the wait for the target and the deactivation."""
        w, ctrl, ctx = self.wiring, self.verl_controller, self.verl_ctx
        gs = self.version
        deactivate = self._ask(
            c,
            "should_deactivate",
            gs,
            lambda: ctrl.policy.should_deactivate(global_steps=gs, is_hybrid_active=ctrl.is_hybrid_active, ctx=ctx),
        )
        if not deactivate:
            return
        target = self._ask(c, "deactivate_wait_samples", gs, lambda: ctrl.policy.deactivate_wait_samples(ctx))
        c.wait_target = int(target)
        t0 = w.now()
        await self.rollouter_standin.wait_for_enough_samples(int(target))
        c.deactivate_wait_s += w.now() - t0
        t1 = w.now()
        await ctrl.deactivate_hybrid_replicas(gs)
        ctx.last_deactivate_duration_s += w.now() - t1
        c.deactivate_s = w.controller.last_deactivate_duration_s

    async def _hand_back_for_training(self, c: _Cycle) -> None:
        """A fit step never trains beside active hybrid replicas: through verl's controller, they go first.

        verl's trainer trains whatever its policy answered; a simulated trainer cannot (its GPUs
        are the hybrids'), and the simulator's safety net may have woken them because nothing
        else could produce the collection. Going through verl's ``deactivate_hybrid_replicas``
        keeps verl's controller state and the context's switch time right.
        """
        w = self.wiring
        t0 = w.now()
        await self.verl_controller.deactivate_hybrid_replicas(self.version)
        self.verl_ctx.last_deactivate_duration_s += w.now() - t0
        c.deactivate_s = w.controller.last_deactivate_duration_s

    async def _update_weights(self, c: _Cycle, *, new_version: bool) -> tuple[list[Any], float] | None:
        """verl's ``_fit_update_weights``; returns the closed rollout window (None at start-up)."""
        w, ctrl, ctx, roll = self.wiring, self.verl_controller, self.verl_ctx, self.rollouter_standin
        gs = self.version + (1 if new_version else 0)
        step_required = w.tracker.step_required_samples
        ctx.total_generated_samples = roll.get_total_produced_samples()
        ctx.expected_samples = step_required * roll.get_completed_steps()
        ctx.buffer_samples = step_required * w.tracker.staleness_threshold
        ctx.step_wait_times, ctx.step_wait_samples = list(self._waits), list(self._wait_samples)
        activate = self._ask(
            c,
            "should_activate_after_step",
            gs,
            lambda: ctrl.policy.should_activate_after_step(
                global_steps=gs, is_hybrid_active=ctrl.is_hybrid_active, ctx=ctx
            ),
        )
        t_sync = w.now()
        update = await self._sync(new_version=new_version, reset=False)
        c.sync_s = w.now() - t_sync
        window = self._end_cycle(c) if new_version else None
        if not self.timing.reset_after_activation:
            self._reset_staleness()
        if activate and (w.tracker.total_steps == 0 or w.tracker.global_steps < w.tracker.total_steps):
            await self._activate(c, gs, update)
        roll.reset_staleness()
        if self.timing.reset_after_activation:
            self._reset_staleness()
        self._ask(c, "update_after_step", gs, lambda: ctrl.policy.update_after_step(global_steps=gs, ctx=ctx))
        ctx.last_deactivate_duration_s = ctx.last_activate_duration_s = 0.0
        self._waits, self._wait_samples = [], []
        return window

    async def _activate(self, c: _Cycle, gs: int, update: WeightUpdate) -> None:
        """verl's hybrid weight sync, activation and rebalance request."""
        w, ctrl, ctx, roll = self.wiring, self.verl_controller, self.verl_ctx, self.rollouter_standin
        t0 = w.now()
        activations = w.controller.activations
        await ctrl.sync_hybrid_weights(global_steps=gs)
        await ctrl.activate_hybrid_replicas(gs)
        c.activated = w.controller.activations > activations
        if self.enable_rebalance:
            moved = roll.moved
            rebalances = w.controller.rebalances
            self._ask(c, "should_rebalance", gs, lambda: ctrl.policy.request_rebalance(global_steps=gs, ctx=ctx))
            await roll.settle()
            c.rebalanced = w.controller.rebalances > rebalances
            c.moved = roll.moved - moved
            c.decisions[-1] = _with_value(c.decisions[-1], c.rebalanced)
        ctx.last_activate_duration_s += w.now() - t0

    def _ask(self, c: _Cycle, method: str, gs: int, call: Callable[[], Any]) -> Any:
        """Call verl's policy (its own code guards nothing; a dynres adapter guards itself) and record it."""
        t0 = time.perf_counter()
        value = call()
        c.decisions.append(
            DecisionRecord(
                method=method,
                value=value,
                raw=repr(value),
                fallback=False,
                clamped=False,
                reason="",
                global_steps=gs,
                at_s=self.wiring.now(),
                wall_s=time.perf_counter() - t0,
            )
        )
        return value


def _with_value(rec: DecisionRecord, value: Any) -> DecisionRecord:
    """``rec`` recording ``value`` (verl's request_rebalance returns nothing; the record says whether it moved)."""
    return DecisionRecord(
        **{**rec.field_values(), "value": value, "raw": repr(value)}, at_s=rec.at_s, wall_s=rec.wall_s
    )


def verl_policy_name(name: str) -> str:
    """A policy name as verl's registry knows it: ``verl:<name>`` is verl's own ``<name>``."""
    return name[len(OWN_PREFIX) :] if name.startswith(OWN_PREFIX) else name


def host_label(name: str) -> str:
    """How runs of a verl-hosted policy are labelled: ``dynres:<name>`` as is, verl's own as ``verl:<name>``."""
    bare = verl_policy_name(name)
    return bare if bare.startswith(BRIDGE_PREFIX) else OWN_PREFIX + bare


def check_verl_policy(name: str) -> None:
    """Raise PolicyNotFoundError naming verl's registered policies when ``name`` is not one of them."""
    mod = _schedule_module()
    bare = verl_policy_name(name)
    registry = mod.base._policy_registry
    if bare not in registry:
        with contextlib.suppress(ImportError):  # verl ships fixed_ratio but registers it only once imported
            importlib.import_module(f"{SCHEDULE_PACKAGE}.{bare}_policy")
    if bare not in registry:
        hint = (
            f"; with --host verl a dynres policy is named dynres:{bare}" if f"{BRIDGE_PREFIX}{bare}" in registry else ""
        )
        raise PolicyNotFoundError(
            f"verl's policy registry has no {bare!r}{hint}; registered: {', '.join(sorted(registry))}"
        )


def build_verl_policy(
    name: str, *, only_hybrid: bool, ratio: float | None, params: Mapping[str, Any] | None = None
) -> Any:
    """verl's ``build_policy(name, deactivate_ratio=..., only_hybrid=...)``, with a dynres policy's params passed
    the way dynres-verl reads them (the :data:`PARAMS_ENV` variable) and verl's printing kept off stdout."""
    check_verl_policy(name)
    mod = _schedule_module()
    env = os.environ.get(PARAMS_ENV)
    try:
        if params:
            import json

            os.environ[PARAMS_ENV] = json.dumps(dict(params))
        with contextlib.redirect_stdout(io.StringIO()):
            kwargs: dict[str, Any] = {"only_hybrid": only_hybrid}
            if ratio is not None:
                kwargs["deactivate_ratio"] = ratio
            return mod.build_policy(verl_policy_name(name), **kwargs)
    finally:
        if env is None:
            os.environ.pop(PARAMS_ENV, None)
        else:
            os.environ[PARAMS_ENV] = env


class VerlHosted(Policy):
    """Stands where the dynres runtime keeps its policy: verl's trainer loop calls verl's policy instead."""

    name = "verl_hosted"

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        """Never asked: the decisions are verl's policy's."""
        raise NotImplementedError("a verl-hosted run asks verl's policy, not this placeholder")

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        """Never asked (see should_deactivate)."""
        raise NotImplementedError("a verl-hosted run asks verl's policy, not this placeholder")

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        """Never asked (see should_deactivate)."""
        raise NotImplementedError("a verl-hosted run asks verl's policy, not this placeholder")
