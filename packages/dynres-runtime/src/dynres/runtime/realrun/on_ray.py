"""``dynres run`` on Ray: the coordinator actor (the rollouter side of a run) and the driver's run path.

``run_fully_async`` runs here, inside one async actor, and reaches replicas and the train engine
only through their proxies (``await handle.method.remote()``). The message queue lives in this
actor on purpose: the rollouter's admission rule and the trainer loop's batch wait share the
queue's condition variable, so a queue in another process would cost a round trip per sample
and per admission check while buying nothing; samples are token ids, not tensors.

The driver process only starts things, polls :meth:`CoordinatorActor.events` for progress and
calls :meth:`CoordinatorActor.stop` on Ctrl-C. A replica whose actor dies is recreated by the
coordinator (:func:`~dynres.runtime.backends.ray.cluster.respawn_replica`, an actor the coordinator
owns); at the end the driver takes the current replicas back (:meth:`CoordinatorActor.replicas`)
so that it shuts the recreated ones down too. If the driver dies, Ray kills this actor with it
(it is owned by the driver's job), and the engines go with their placement groups.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dynres.core.errors import RuntimeStateError
from dynres.runtime.backends.ray._ray import remote_cause
from dynres.runtime.backends.ray.factory import Factory
from dynres.runtime.backends.ray.monitor import LoopLag, LoopLagMonitor
from dynres.runtime.realrun.status import ENGINES, PhaseCallback, run_status

if TYPE_CHECKING:
    from dynres.core.config import DynresConfig
    from dynres.runtime.backends.ray.cluster import RayCluster, RaySystem
    from dynres.runtime.backends.ray.proxies import RayTrainEngine
    from dynres.runtime.realrun.config import RunConfig
    from dynres.runtime.realrun.output import MetricsSink

logger = logging.getLogger("dynres.runtime.realrun")


class CoordinatorActor:
    """Hosts one fully-async run; ``run`` returns its RunReport, ``events`` streams cycle reports."""

    def __init__(self, lag_interval_s: float = 0.01) -> None:
        """Create an idle coordinator whose loop is watched every ``lag_interval_s`` seconds."""
        self._monitor = LoopLagMonitor(lag_interval_s)
        self._events: list[Any] = []
        self._run: Any = None
        self._task: asyncio.Task[Any] | None = None
        self._started_at: float | None = None

    async def run(self, build: Factory, standalone: Sequence[Any], hybrid: Sequence[Any], train_engine: Any) -> Any:
        """Build the RunSpec with ``build(standalone=, hybrid=, train_engine=, progress=)`` and run it."""
        from dynres.runtime.loop.driver import FullyAsyncRun

        if self._task is not None:
            raise RuntimeStateError("this coordinator already ran; start a new one for another run")
        self._task = asyncio.current_task()
        self._monitor.start()
        spec = await build.build(
            standalone=list(standalone), hybrid=list(hybrid), train_engine=train_engine, progress=self._events.append
        )
        self._run = FullyAsyncRun(spec)
        # Building the spec imports modules (blocking, once); measure the run itself.
        self._monitor.reset()
        self._started_at = time.perf_counter()
        try:
            return await self._run.run()
        finally:
            if spec.ledger is not None:
                spec.ledger.close()

    async def replicas(self) -> list[Any]:
        """The run's replica proxies now: a recreated replica in place of the one it replaced."""
        run = self._run
        return [*run.controller.standalone, *run.controller.hybrid] if run is not None else []

    async def events(self, since: int = 0) -> list[Any]:
        """Cycle reports from index ``since`` on (the driver polls this for progress)."""
        return self._events[since:]

    async def status(self) -> dict[str, Any]:
        """A live snapshot (:func:`~dynres.runtime.realrun.status.run_status`): state, queue, counters, phase."""
        return run_status(self._run)

    async def stop(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Cancel the run; its teardown aborts every in-flight request. Returns what was left.

        ``stopped``: the run ended within ``timeout_s``; ``in_flight``: requests still running on
        a replica afterwards (0 after a clean stop); ``aborts``: abort calls made by the run.
        """
        task = self._task
        stopped = True
        if task is not None and not task.done():
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
            stopped = bool(done)
        run = self._run
        in_flight = run.balancer.total_in_flight if run is not None and run.balancer is not None else 0
        aborts = run.ops.stats["abort"].count if run is not None and run.ops and "abort" in run.ops.stats else 0
        return {"stopped": stopped, "in_flight": in_flight, "aborts": aborts}

    async def interrupted_report(self) -> Any:
        """The RunReport of a run cancelled by :meth:`stop` (what it had), or None."""
        return self._run.interrupted_report if self._run is not None else None

    async def loop_lag(self, reset: bool = False) -> LoopLag:
        """Worst event-loop gap of this actor since the last reset."""
        self._monitor.start()
        return self._monitor.snapshot(reset=reset)

    async def ping(self) -> str:
        """Answer with this actor's node id."""
        from dynres.runtime.backends.ray._ray import require_ray

        return require_ray().get_runtime_context().get_node_id()


async def run_on_ray(
    cfg: RunConfig,
    model_path: str | None,
    sink: MetricsSink,
    backend: dict[str, Any],
    on_status: Callable[[dict[str, Any]], None] | None,
    poll_s: float,
    on_interrupt: Callable[[Any], None] | None = None,
    on_phase: PhaseCallback | None = None,
    spec_kwargs: Mapping[str, Any] | None = None,
    on_engines: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Start the engines as Ray actors, run the loop in a :class:`CoordinatorActor`, stream cycles to ``sink``.

    Fills ``backend`` with placement, process ids, nodes, loop lags, lost replicas and shutdown
    problems, and hands it to ``on_engines`` once every engine has started; ``spec_kwargs`` go to
    :func:`~dynres.runtime.realrun.builders.build_spec` (output folder, checkpoint to resume). On
    cancellation (Ctrl-C) stops the coordinator cleanly and hands the interrupted run's report
    (None if the run had not started) to ``on_interrupt`` before re-raising.
    """
    from dynres.runtime.backends.ray._ray import require_ray
    from dynres.runtime.backends.ray.cluster import RayCluster, driver_node_id
    from dynres.runtime.realrun.builders import engine_factories

    ray = require_ray()
    cluster = RayCluster(cfg.ray)
    factories = engine_factories(cfg, model_path)
    dyn = cfg.dynres_config()
    coordinator = None
    run_fut: asyncio.Future[Any] | None = None
    try:
        if on_phase is not None:
            on_phase(ENGINES, 0, dyn.num_standalone_replicas + dyn.num_hybrid_replicas + 1)
        system, trainer = await _start_engines(cluster, dyn, factories, backend, ray, on_phase)
        if on_engines is not None:
            on_engines(backend)
        # The coordinator sits next to the driver: progress polls stay local, and losing a
        # rollout node never takes the run's brain with it.
        coordinator = cluster.spawn(
            CoordinatorActor, cfg.ray.lag_interval_s, node_id=driver_node_id(), name="dynres-coordinator"
        )
        build = Factory(
            "dynres.runtime.realrun.builders:build_spec",
            {"config": cfg.model_dump(), "restart": RESPAWN, **dict(spec_kwargs or {})},
        )
        # Engine start-up (imports, model loading) is not the run: measure the loops from here.
        await asyncio.gather(*(p.loop_lag(reset=True) for p in [*system.replicas, trainer]))
        run_fut = asyncio.ensure_future(
            _await(coordinator.run.remote(build, system.standalone, system.hybrid, trainer))
        )
        report = await _follow(coordinator, run_fut, sink, on_status, poll_s)
        await _adopt(coordinator, system)
        backend["loop_lag"] = await _loop_lags(coordinator, system)
        return report
    except asyncio.CancelledError:
        if coordinator is not None:
            await _stop(coordinator, cfg.ray.shutdown_timeout_s, sink, backend, on_interrupt)
        if run_fut is not None:
            # The remote run ends with TaskCancelledError now; collect it so nothing is logged.
            run_fut.cancel()
            await asyncio.gather(run_fut, return_exceptions=True)
        raise
    finally:
        if coordinator is not None:
            await _adopt(coordinator, cluster.system)
        backend["lost"] = {p.replica_id: p.lost_reason for p in cluster.system.replicas if p.lost_reason is not None}
        backend["shutdown_problems"] = await cluster.shutdown()


RESPAWN = "dynres.runtime.backends.ray.cluster:respawn_replica"
"""The restarter a run on Ray recreates a gone replica with (runs in the coordinator)."""


async def _adopt(coordinator: Any, system: RaySystem, timeout_s: float = 10.0) -> None:
    """Put the coordinator's current replica proxies (recreated ones included) into ``system``, so
    that the driver's shutdown and loop-lag queries reach them; a dead coordinator changes nothing."""
    try:
        current = {p.replica_id: p for p in await asyncio.wait_for(_await(coordinator.replicas.remote()), timeout_s)}
    except Exception:
        return
    system.standalone = [current.get(p.replica_id, p) for p in system.standalone]
    system.hybrid = [current.get(p.replica_id, p) for p in system.hybrid]


async def _start_engines(
    cluster: RayCluster,
    dyn: DynresConfig,
    factories: tuple[Factory | None, Factory | None, Factory],
    backend: dict[str, Any],
    ray: Any,
    on_phase: PhaseCallback | None = None,
) -> tuple[RaySystem, RayTrainEngine]:
    """Place and start every engine; note start-up time, placement and live nodes in ``backend``.

    Returns the RaySystem and its train engine proxy (a system without one is an error); each
    engine started is told to ``on_phase`` (:data:`~dynres.runtime.realrun.status.ENGINES`, n of m).
    """
    s_f, h_f, t_f = factories

    def started(done: int, total: int) -> None:
        if on_phase is not None:
            on_phase(ENGINES, done, total)

    system = await cluster.start(dyn, standalone=s_f, hybrid=h_f, trainer=t_f, on_started=started)
    trainer = system.trainer
    if trainer is None:
        raise RuntimeStateError("the Ray cluster started no train engine; give RayCluster.start a trainer factory")
    backend["engines_start_s"] = round(system.start_s, 3)
    engines = {getattr(p, "replica_id", "trainer"): p for p in [*system.replicas, trainer]}
    backend["placement"] = {name: p.node_id for name, p in engines.items()}
    backend["pids"] = {name: p.pid for name, p in engines.items()}
    backend["nodes"] = sorted({n["NodeID"] for n in ray.nodes() if n.get("Alive")})
    return system, trainer


async def _follow(
    coordinator: Any,
    run_fut: asyncio.Future[Any],
    sink: MetricsSink,
    on_status: Callable[[dict[str, Any]], None] | None,
    poll_s: float,
) -> Any:
    """Every ``poll_s`` seconds pass new cycle reports to ``sink`` and the status to ``on_status``
    until the run ends; return its report or raise its error (the one raised remotely, not Ray's wrapper)."""
    seen = 0
    while True:
        done, _ = await asyncio.wait({run_fut}, timeout=poll_s)
        for cycle in await coordinator.events.remote(seen):
            seen += 1
            sink(cycle)
        if on_status is not None:
            on_status(await coordinator.status.remote())
        if done:
            try:
                return done.pop().result()
            except Exception as exc:
                err = remote_cause(exc)
                if err is exc:
                    raise
                raise err from exc


async def _stop(
    coordinator: Any,
    timeout_s: float,
    sink: MetricsSink,
    backend: dict[str, Any],
    on_interrupt: Callable[[Any], None] | None,
) -> None:
    """After Ctrl-C: stop the run, pass its last cycles to ``sink`` and its report to ``on_interrupt``.

    The coordinator's teardown aborts in-flight requests and deactivates hybrids; what ``stop``
    says (or why it failed) goes to ``backend["stop"]``.
    """
    try:
        backend["stop"] = await asyncio.wait_for(coordinator.stop.remote(timeout_s), timeout_s + 5)
        for cycle in await coordinator.events.remote(sink.count):
            sink(cycle)
        if on_interrupt is not None:
            on_interrupt(await coordinator.interrupted_report.remote())
    except Exception as exc:
        backend["stop"] = {"stopped": False, "error": f"{type(exc).__name__}: {exc}"}
        logger.warning("coordinator did not stop cleanly: %s", exc)


async def _await(ref: Any) -> Any:
    return await ref


async def _loop_lags(coordinator: Any, system: Any) -> dict[str, float]:
    """Worst event-loop gap of each live actor during the run (milliseconds)."""
    out: dict[str, float] = {}
    targets = [("coordinator", coordinator.loop_lag.remote())]
    targets += [(p.replica_id, p.handle.loop_lag.remote()) for p in system.replicas if p.lost_reason is None]
    targets.append(("trainer", system.trainer.handle.loop_lag.remote()))
    for name, ref in targets:
        try:
            out[name] = round((await ref).max_gap_s * 1000, 2)
        except Exception:
            continue
    return out
