"""The rollouter loop: admits prompt groups, generates them through the balancer, fills the queue.

**Admission rule** (verl's staleness control). ``max_required_samples =
int(required_samples x (staleness_threshold + 1) x trigger_parameter_sync_step)``. The
rollouter counts ``staleness_samples``: the samples admitted under the current weight version
plus those carried over from the previous one. At each weight sync it is reset to the samples
still queued or in flight. A new sample is admitted only while

* ``staleness_samples < max_required_samples + extra_samples`` (production may run at most
  ``staleness_threshold`` cycles ahead of consumption; ``extra_samples`` is the policy's
  ``admit_extra_samples`` answer at the latest weight sync, 0 unless a policy asks for more), and
* in-flight samples < ``min(routable replicas x concurrent_samples_per_replica,
  max_required_samples + extra_samples)`` (the concurrency capacity, the ``cap`` of the rollout
  metric), and
* consumed + queued + in-flight samples < the run's demand (``num_cycles x
  step_required_samples``), so the run ends with nothing generated in vain.

A sample the queue drops as stale gives its place back (``staleness_samples -= 1``) so that a
replacement can be generated; otherwise drops could starve the trainer within a cycle.

The rollouter also records the rollout activity as ``(t, active, capacity)`` change points, one
window per sync cycle, for ``dynamic_resource/rollout_resource_utilization``. Each routable
replica counts once in the capacity.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass

from dynres.core.metrics import RolloutPoint, rollout_capacity
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import GenerationRequest, GenerationResult
from dynres.runtime.samples import PromptGroup, Sample

logger = logging.getLogger("dynres.runtime.loop.rollouter")

PromptSource = Iterable[PromptGroup] | AsyncIterable[PromptGroup]
"""What a run reads prompt groups from: any iterable or async iterable of PromptGroup."""


@dataclass(frozen=True)
class PartialSample:
    """A sample whose generation was interrupted at the end of a run, with all output so far."""

    group: PromptGroup
    """The sample's prompt group (prompt and rollout.n responses to generate)."""
    results: tuple[GenerationResult, ...]
    """One result per response: finished ones as they are, unfinished ones with ``finish_reason="abort"``."""
    start_version: int
    """Weight version the sample started with."""
    started_s: float
    """Run-clock time the sample was admitted (seconds since run start)."""

    def requests(self) -> list[GenerationRequest]:
        """The requests that resume the unfinished responses from their partial output."""
        out = []
        for req, res in zip(self.group.requests(), self.results, strict=True):
            if res.aborted:
                out.append(req.resumed(res.token_ids, res.logprobs))
        return out


class Rollouter:
    """Admits samples under the staleness and capacity rules and generates them."""

    def __init__(
        self,
        *,
        balancer: LoadBalancer,
        queue: MessageQueue,
        prompts: PromptSource,
        now: Callable[[], float],
        max_required_samples: int,
        concurrent_samples_per_replica: int,
        demand: int | None = None,
    ) -> None:
        """Create a rollouter (call :meth:`run` as a task to start admitting).

        :param balancer: routes the requests.
        :param queue: receives finished samples.
        :param prompts: the prompt source.
        :param now: run clock (seconds since run start).
        :param max_required_samples: staleness bound and capacity cap (samples).
        :param concurrent_samples_per_replica: samples one replica generates at once (count).
        :param demand: samples the trainer will take in this run (None = no limit).
        """
        self.balancer = balancer
        """Routes each admitted sample's requests; its capacity bounds admission."""
        self.queue = queue
        """Receives finished samples; what it holds counts against the staleness budget."""
        self.max_required_samples = max_required_samples
        """Admission bound per weight version (samples)."""
        self.concurrent_samples_per_replica = concurrent_samples_per_replica
        """Samples one replica generates at once (count)."""
        self.demand = demand
        """Samples the trainer will take in this run; admission stops once consumed + queued +
        in flight reach it, so no sample is generated only to be thrown away (None = no limit)."""
        self.extra_samples = 0
        """Samples admitted per weight version beyond ``max_required_samples`` (the policy's
        ``admit_extra_samples`` at the latest weight sync; count)."""
        self.most_extra_samples = 0
        """The largest ``extra_samples`` of the run so far (count; the simulator's lower bound
        lets that many more samples cross each weight sync)."""
        self.version = 0
        """Weight version of the routable replicas (count of syncs)."""
        self.staleness_samples = 0
        """Samples charged to the current weight version (see the module doc)."""
        self.generated = 0
        """Samples fully generated (count)."""
        self.admitted = 0
        """Samples admitted (count)."""
        self.failed = 0
        """Samples given up because a request failed on every replica it tried (count)."""
        self.failed_ids: list[str] = []
        """Ids of those samples, in order (the report names them)."""
        self.source_position = 0
        """Prompt groups taken from the prompt source so far (count; a checkpoint records it so a
        resumed run can restart the source where this one stopped)."""
        self.source_exhausted = False
        """The prompt source has no more prompt groups."""
        self.partials: list[PartialSample] = []
        """Samples interrupted by the end of the run, with their partial output."""
        self._now = now
        self._prompts = prompts
        self._iter: Iterator[PromptGroup] | AsyncIterator[PromptGroup] | None = None
        self._resume: list[PartialSample] = []
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        # sample id -> (group, start version, admitted at, one slot per response: its finished
        # result, or an aborted one carrying partial output from a checkpoint, or None).
        self._slots: dict[str, tuple[PromptGroup, int, float, list[GenerationResult | None]]] = {}
        self._admitting = True
        self._stopped = False
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._points: list[RolloutPoint] = []
        self._window_start = 0.0

    # ---- Observed state ------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Samples being generated now (count)."""
        return len(self._in_flight)

    @property
    def budget(self) -> int:
        """Samples one weight version may admit: max_required_samples + extra_samples (count)."""
        return self.max_required_samples + self.extra_samples

    @property
    def capacity(self) -> int:
        """min(routable replicas x concurrent_samples_per_replica, budget) (samples)."""
        return rollout_capacity(self.balancer.num_replicas, self.concurrent_samples_per_replica, self.budget)

    def can_admit(self) -> bool:
        """True when one more sample may be admitted now."""
        return (
            self._admitting
            and not self._stopped
            and not (self.source_exhausted and not self._resume)
            and len(self._in_flight) < self.capacity
            and self.staleness_samples < self.budget
            and (bool(self._resume) or not self.demand_met())
        )

    def demand_queued(self) -> bool:
        """True when the queue already holds every sample the run still needs (it cannot grow)."""
        return self.demand is not None and self.queue.consumed + self.queue.size >= self.demand

    def demand_met(self) -> bool:
        """True when consumed + queued + in-flight samples cover the run's demand."""
        if self.demand is None:
            return False
        return self.queue.consumed + self.queue.size + len(self._in_flight) >= self.demand

    def finished(self) -> bool:
        """True when no sample will ever be produced again (source exhausted, nothing in flight)."""
        return (self.source_exhausted and not self._resume and not self._in_flight) or self._stopped

    # ---- Events from the run ----------------------------------------------------------------

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._wake is None or self._idle is None:
            self._wake = asyncio.Event()
            self._idle = asyncio.Event()
            if not self._in_flight:
                self._idle.set()
        return self._wake, self._idle

    def poke(self) -> None:
        """Re-check admission (capacity, budget or state changed) and record the rollout point."""
        self._record()
        if self._wake is not None:
            self._wake.set()

    def on_capacity_change(self) -> None:
        """Balancer callback: a replica joined or left routing."""
        self.poke()

    def on_drop(self, sample: Sample) -> None:
        """Queue callback: a sample was dropped as stale; give its place back."""
        self.staleness_samples = max(0, self.staleness_samples - 1)
        self.poke()

    def reset_staleness(self, version: int) -> None:
        """After a weight sync to ``version``: charge only what is still queued or in flight."""
        self.version = version
        self.staleness_samples = self.queue.size + len(self._in_flight)
        # The new version starts with the plain budget until the policy answers for it.
        self.extra_samples = 0
        self.poke()

    def admit_extra(self, samples: int) -> None:
        """Let the current weight version admit ``samples`` beyond max_required_samples (count >= 0)."""
        self.extra_samples = samples
        self.most_extra_samples = max(self.most_extra_samples, samples)
        self.poke()

    def pause_admission(self) -> None:
        """Admit nothing until :meth:`resume_admission`."""
        self._admitting = False

    def resume_admission(self) -> None:
        """Admit again."""
        self._admitting = True
        self.poke()

    async def drain(self) -> None:
        """Wait until no request runs on any replica (pause admission first).

        Requests waiting for a routable replica (none exists, e.g. an only-hybrid cluster while
        training) do not hold the wait: they have produced nothing yet.
        """
        await self.balancer.wait_all_idle()

    def add_resumed(self, partials: list[PartialSample]) -> None:
        """Samples from a checkpoint to finish first, continuing from their partial output."""
        self._resume.extend(partials)

    # ---- Rollout activity (metric input) ------------------------------------------------------

    def _record(self) -> None:
        try:
            t = self._now()
        except RuntimeError:  # no running loop yet (built before the run)
            return
        p = RolloutPoint(t, len(self._in_flight), self.capacity)
        pts = self._points
        if pts and pts[-1].t == t:
            pts[-1] = p
        elif not pts or (pts[-1].active, pts[-1].capacity) != (p.active, p.capacity):
            pts.append(p)

    def take_window(self) -> tuple[list[RolloutPoint], float]:
        """Close the current rollout window now; return its points and end time, open the next."""
        end = self._now()
        self._record()
        points = [p for p in self._points if p.t < end] or [RolloutPoint(self._window_start, 0, 0)]
        last = self._points[-1]
        self._points = [RolloutPoint(end, last.active, last.capacity)]
        self._window_start = end
        return points, end

    def start_window(self) -> None:
        """Open the first rollout window now."""
        self._window_start = self._now()
        self._points = [RolloutPoint(self._window_start, len(self._in_flight), self.capacity)]

    # ---- Loops --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Admission loop: admit samples while the rules allow, until stopped or exhausted."""
        wake, _idle = self._events()
        while not self._stopped:
            if not self.can_admit():
                if self.source_exhausted and not self._resume:
                    await self.queue.notify()  # the trainer may be waiting for a sample that won't come
                    return
                wake.clear()
                await wake.wait()
                continue
            if self._resume:
                partial = self._resume.pop(0)
                self._start(partial.group, partial.start_version, partial)
                continue
            group = await self._next_prompt()
            if group is None:
                self.source_exhausted = True
                logger.info("prompt source exhausted after %d samples", self.admitted)
                continue
            self._start(group, self.version, None)

    async def _next_prompt(self) -> PromptGroup | None:
        if self._iter is None:
            src = self._prompts
            self._iter = aiter(src) if isinstance(src, AsyncIterable) else iter(src)
        try:
            if isinstance(self._iter, AsyncIterator):
                group = await anext(self._iter)
            else:
                group = next(self._iter)
        except (StopIteration, StopAsyncIteration):
            return None
        self.source_position += 1
        return group

    def _start(self, group: PromptGroup, start_version: int, partial: PartialSample | None) -> None:
        _, idle = self._events()
        if group.sample_id in self._in_flight:
            raise ValueError(f"prompt source yielded sample id {group.sample_id!r} twice; ids must be unique")
        self.admitted += 1
        self.staleness_samples += 1
        idle.clear()
        started = self._now() if partial is None else partial.started_s
        task = asyncio.create_task(
            self._generate(group, start_version, started, partial), name=f"dynres-sample-{group.sample_id}"
        )
        self._in_flight[group.sample_id] = task
        self._record()

    async def _fill(self, slots: list[GenerationResult | None], i: int, request: GenerationRequest) -> None:
        slots[i] = await self.balancer.generate(request)

    async def _generate(
        self, group: PromptGroup, start_version: int, started: float, partial: PartialSample | None
    ) -> None:
        slots: list[GenerationResult | None] = [None] * group.n if partial is None else list(partial.results)
        self._slots[group.sample_id] = (group, start_version, started, slots)
        try:
            if partial is None:
                await asyncio.gather(*(self._fill(slots, i, r) for i, r in enumerate(group.requests())))
            else:
                todo = [i for i, r in enumerate(partial.results) if r.aborted]
                redo = partial.requests()
                await asyncio.gather(*(self._fill(slots, i, r) for i, r in zip(todo, redo, strict=True)))
            results = [r for r in slots if r is not None]
            if any(r.aborted for r in results):
                # The balancer is draining (end of run): keep everything generated so far.
                self.partials.append(PartialSample(group, tuple(results), start_version, started))
            else:
                sample = Sample(
                    group=group,
                    responses=tuple(results),
                    start_version=start_version,
                    finish_version=max(r.weight_version for r in results),
                    started_s=started,
                    finished_s=self._now(),
                )
                self.generated += 1
                await self.queue.put(sample)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.failed += 1
            self.failed_ids.append(group.sample_id)
            logger.exception("sample %s failed on every replica it tried; it is given up", group.sample_id)
        finally:
            del self._in_flight[group.sample_id]
            self._slots.pop(group.sample_id, None)
            self._record()
            if not self._in_flight and self._idle is not None:
                self._idle.set()
            if self._wake is not None:
                self._wake.set()
            if self.finished():
                await self.queue.notify()

    def in_flight_partials(self) -> list[PartialSample]:
        """The samples being generated now, as partial samples (for a checkpoint taken mid-run).

        Finished responses are kept as they are; an unfinished one carries the partial output of
        its earlier attempts (the tokens of the attempt running now are not known without an
        abort, so that attempt is redone on resume), and admitted samples come first, then the
        ones a checkpoint handed to this run that have not started again yet.
        """
        out = []
        for group, start_version, started, slots in self._slots.values():
            results = []
            for i, res in enumerate(slots):
                if res is not None and not res.aborted:
                    results.append(res)
                    continue
                cur = self.balancer.current_request(group.request_id(i))
                tokens = cur.partial_token_ids if cur is not None else (res.token_ids if res is not None else ())
                logprobs = cur.partial_logprobs if cur is not None else (res.logprobs if res is not None else ())
                results.append(
                    GenerationResult(
                        request_id=group.request_id(i),
                        token_ids=tokens,
                        logprobs=logprobs,
                        finish_reason="abort",
                        replica_id="",
                    )
                )
            out.append(PartialSample(group, tuple(results), start_version, started))
        out.extend(self._resume)
        return out

    async def stop(self) -> None:
        """Stop admitting and wait for in-flight samples (the balancer must be draining)."""
        self._admitting = False
        if self._wake is not None:
            self._wake.set()
        tasks = list(self._in_flight.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._stopped = True
