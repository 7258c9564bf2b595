"""The coordinator actor: the rollouter side of a run (balancer, message queue, controller, loops).

``run_fully_async`` runs here, inside one async actor, and reaches replicas and the train engine
only through their proxies (``await handle.method.remote()``). The message queue lives in this
actor on purpose: the rollouter's admission rule and the trainer loop's batch wait share the
queue's condition variable, so a queue in another process would cost a round trip per sample
and per admission check while buying nothing; samples are token ids, not tensors.

The driver process only starts things, polls :meth:`CoordinatorActor.events` for progress and
calls :meth:`CoordinatorActor.stop` on Ctrl-C. If the driver dies, Ray kills this actor with it
(it is owned by the driver's job), and the engines go with their placement groups.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from dynres.core.errors import RuntimeStateError
from dynres.runtime.backends.ray.factory import Factory
from dynres.runtime.backends.ray.monitor import LoopLag, LoopLagMonitor


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
        from dynres.runtime.loop.run import FullyAsyncRun

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
        return await self._run.run()

    async def events(self, since: int = 0) -> list[Any]:
        """Cycle reports from index ``since`` on (the driver polls this for progress)."""
        return self._events[since:]

    async def status(self) -> dict[str, Any]:
        """A live snapshot: controller state, queue size, sample counters, in-flight requests."""
        run = self._run
        if run is None or run.controller is None:
            return {"state": "STARTING"}
        out: dict[str, Any] = {
            "state": run.controller.state.value,
            "queue": run.queue.size if run.queue is not None else 0,
            "in_flight": run.balancer.total_in_flight if run.balancer is not None else 0,
            "routable": run.balancer.replica_ids if run.balancer is not None else [],
            "quarantined": dict(run.controller.quarantined),
        }
        if run.rollouter is not None:
            out["generated"] = run.rollouter.generated
        if run.queue is not None:
            out["consumed"] = run.queue.consumed
        return out

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

    async def loop_lag(self, reset: bool = False) -> LoopLag:
        """Worst event-loop gap of this actor since the last reset."""
        self._monitor.start()
        return self._monitor.snapshot(reset=reset)

    async def ping(self) -> str:
        """Answer with this actor's node id."""
        from dynres.runtime.backends.ray._ray import require_ray

        return require_ray().get_runtime_context().get_node_id()
