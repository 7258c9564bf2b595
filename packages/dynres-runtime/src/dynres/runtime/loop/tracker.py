"""The one place where every :class:`~dynres.core.ScheduleContext` field is computed.

A real run and a simulated run build their contexts here, from the same live objects (queue,
rollouter, balancer, controller) and the per-cycle measurements the trainer loop hands in, so a
policy sees identical definitions in both.

Field definitions (beyond the verl ones documented on ScheduleContext):

* ``now``: seconds since the run started, on the event loop's clock.
* ``expected_samples``: ``step_required_samples x global_steps``.
* ``total_generated_samples``: samples the rollouter finished since training began (stale
  drops included: they were generated).
* ``in_flight_samples``: samples admitted and not yet finished.
* ``num_active_replicas``: routable replicas, each counted once.
* ``generation_rate``: samples finished during the latest sync cycle / its wall time.
* ``consumption_rate``: samples the trainer consumed in the latest cycle / the seconds its
  ``train_step`` calls took.
* ``last_train_time_s``: summed compute phases of the latest cycle's fit steps.
* ``total_steps``: the run's starting ``global_steps`` plus the cycles it was asked to run.
* ``last_hybrid_active_s`` / ``last_hybrid_generated_samples``: time from each hybrid activation
  to the start of the next deactivation, and the samples finished meanwhile, summed over the
  latest cycle (an activation after a cycle's weight sync counts towards the next cycle).
* ``last_hybrid_tokens`` / ``last_standalone_tokens``: growth of the replicas' own
  ``generated_tokens`` counters (:func:`~dynres.runtime.protocols.generated_tokens`) between
  the ends of the previous and the latest cycle, summed per kind; 0 for a kind none of whose
  replicas count. An engine adds a request's tokens when it finishes or is aborted, so a hybrid
  window's tokens are all counted by the end of the cycle that deactivates it (the deactivation
  aborts everything on the hybrids), while standalone counts lag by their requests still running.
* ``last_sync_s``: the latest cycle's weight sync (export and loading into standalone replicas).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dynres.core import ScheduleContext
from dynres.core.context import step_required_samples
from dynres.runtime.loop.controller import Controller
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.rollouter import Rollouter
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import Replica, generated_tokens


@dataclass
class CycleMeasurements:
    """What the trainer measured over one finished sync cycle."""

    wait_times: tuple[float, ...] = ()
    """Seconds each collection waited for its samples."""
    wait_samples: tuple[int, ...] = ()
    """Samples each collection had to wait for (max(0, required - queue size at wait start))."""
    cycle_time_s: float = 0.0
    """Wall time of the cycle (seconds)."""
    train_time_s: float = 0.0
    """Summed compute phases of the cycle's fit steps (seconds)."""
    train_call_s: float = 0.0
    """Summed duration of the cycle's train_step calls (seconds)."""
    consumed: int = 0
    """Samples the trainer consumed in the cycle (count)."""
    generated: int = 0
    """Samples the rollouter finished during the cycle (count)."""
    sync_s: float = 0.0
    """Seconds of the cycle's weight sync (export and load into the standalone replicas)."""
    hybrid_s: float = 0.0
    """Seconds hybrid replicas were routable during the cycle (filled by the tracker)."""
    hybrid_generated: int = 0
    """Samples finished while they were (count, filled by the tracker)."""
    hybrid_tokens: int = 0
    """Response tokens the hybrid replicas counted during the cycle (tokens, filled by the tracker)."""
    standalone_tokens: int = 0
    """Response tokens the standalone replicas counted during the cycle (tokens, filled by the tracker)."""


class RunTracker:
    """Holds the run's step bookkeeping and builds the ScheduleContext from live state."""

    def __init__(
        self,
        *,
        required_samples: int,
        trigger_parameter_sync_step: int,
        staleness_threshold: float,
        num_standalone_replicas: int,
        num_hybrid_replicas: int,
        queue: MessageQueue,
        rollouter: Rollouter,
        balancer: LoadBalancer,
        controller: Controller,
        now: Callable[[], float],
        standalone: Sequence[Replica] = (),
        hybrid: Sequence[Replica] = (),
        shared_host: bool = False,
    ) -> None:
        """Track a run over the given live objects (counts in samples and replicas); ``standalone``
        and ``hybrid`` are the replicas whose token counters feed the ``last_*_tokens`` fields;
        ``shared_host``: they all generate on one host's compute."""
        self.required_samples = required_samples
        """Samples per collection (count)."""
        self.trigger_parameter_sync_step = trigger_parameter_sync_step
        """Collections per sync cycle (count)."""
        self.staleness_threshold = staleness_threshold
        """verl's staleness_threshold (fraction of a cycle)."""
        self.num_standalone_replicas = num_standalone_replicas
        """Standalone replicas in the cluster (count)."""
        self.num_hybrid_replicas = num_hybrid_replicas
        """Hybrid replicas in the cluster (count)."""
        self.shared_host = shared_host
        """Every replica generates on one host's compute (ScheduleContext.shared_host)."""
        self.global_steps = 0
        """Completed sync cycles (count)."""
        self.last = CycleMeasurements()
        """Measurements of the latest finished cycle."""
        self.total_steps = 0
        """Sync cycles the run will have done when it ends (count; 0 = unknown)."""
        self._hybrid_since: tuple[float, int] | None = None
        self._hybrid_s = 0.0
        self._hybrid_generated = 0
        self._replicas = (tuple(standalone), tuple(hybrid))
        self._retired_tokens = (0, 0)  # tokens of replicas that recreated ones replaced
        self._tokens_at_cycle_start = self._tokens()
        self.queue = queue
        self.rollouter = rollouter
        self.balancer = balancer
        self.controller = controller
        self._now = now

    @property
    def step_required_samples(self) -> int:
        """required_samples x trigger_parameter_sync_step (samples)."""
        return step_required_samples(self.required_samples, self.trigger_parameter_sync_step)

    def _tokens(self) -> tuple[int, int]:
        """Tokens the (standalone, hybrid) replicas have counted so far (tokens; 0 where none counts)."""
        return (
            self._retired_tokens[0] + sum(generated_tokens(r) or 0 for r in self._replicas[0]),
            self._retired_tokens[1] + sum(generated_tokens(r) or 0 for r in self._replicas[1]),
        )

    def replace_replica(self, old: Replica, new: Replica) -> None:
        """A recreated replica took ``old``'s place: count its tokens from now on, keep ``old``'s."""
        gone = generated_tokens(old) or 0
        standalone, hybrid = self._retired_tokens
        self._retired_tokens = (
            standalone + (gone if old in self._replicas[0] else 0),
            hybrid + (gone if old in self._replicas[1] else 0),
        )
        self._replicas = (
            tuple(new if r is old else r for r in self._replicas[0]),
            tuple(new if r is old else r for r in self._replicas[1]),
        )

    def hybrid_started(self) -> None:
        """Hybrid replicas just became routable: start counting their time and output."""
        if self._hybrid_since is None:
            self._hybrid_since = (self._now(), self.rollouter.generated)

    def hybrid_stopping(self) -> None:
        """Hybrid replicas are about to leave routing: add the interval to the current cycle."""
        if self._hybrid_since is not None:
            t0, g0 = self._hybrid_since
            self._hybrid_s += self._now() - t0
            self._hybrid_generated += self.rollouter.generated - g0
            self._hybrid_since = None

    def end_cycle(self, m: CycleMeasurements) -> None:
        """Record a finished cycle (with its hybrid time) and count it in global_steps."""
        standalone, hybrid = tokens = self._tokens()
        self.last = dataclasses.replace(
            m,
            hybrid_s=self._hybrid_s,
            hybrid_generated=self._hybrid_generated,
            standalone_tokens=max(0, standalone - self._tokens_at_cycle_start[0]),
            hybrid_tokens=max(0, hybrid - self._tokens_at_cycle_start[1]),
        )
        self._tokens_at_cycle_start = tokens
        self._hybrid_s = 0.0
        self._hybrid_generated = 0
        self.global_steps += 1

    def context(self) -> ScheduleContext:
        """The context of this instant."""
        m = self.last
        return ScheduleContext(
            global_steps=self.global_steps,
            now=self._now(),
            required_samples=self.required_samples,
            trigger_parameter_sync_step=self.trigger_parameter_sync_step,
            staleness_threshold=self.staleness_threshold,
            total_steps=self.total_steps,
            partial_rollout=self.balancer.partial_rollout,
            total_generated_samples=self.rollouter.generated,
            expected_samples=self.step_required_samples * self.global_steps,
            queue_size=self.queue.size,
            in_flight_samples=self.rollouter.in_flight,
            step_wait_times=m.wait_times,
            step_wait_samples=m.wait_samples,
            is_hybrid_active=self.controller.is_hybrid_active,
            num_standalone_replicas=self.num_standalone_replicas,
            num_hybrid_replicas=self.num_hybrid_replicas,
            num_active_replicas=min(
                self.balancer.num_replicas, self.num_standalone_replicas + self.num_hybrid_replicas
            ),
            shared_host=self.shared_host,
            last_activate_duration_s=self.controller.last_activate_duration_s,
            last_deactivate_duration_s=self.controller.last_deactivate_duration_s,
            activation_elapsed_s=self.controller.activation_elapsed_s(),
            generation_rate=m.generated / m.cycle_time_s if m.cycle_time_s > 0 else 0.0,
            consumption_rate=m.consumed / m.train_call_s if m.train_call_s > 0 else 0.0,
            last_train_time_s=m.train_time_s,
            last_cycle_time_s=m.cycle_time_s,
            last_hybrid_active_s=m.hybrid_s,
            last_hybrid_generated_samples=m.hybrid_generated,
            last_hybrid_tokens=m.hybrid_tokens,
            last_standalone_tokens=m.standalone_tokens,
            last_sync_s=m.sync_s,
        )
