"""Hypothesis strategies for `ScheduleContext` and `RequestContext`, and ready-made contexts.

Every context these strategies produce is one the runtime could really hand to a policy: the
fields agree with each other the way the controller computes them (``expected_samples`` is
``step_required_samples x global_steps``, the queue holds the surplus, the active-replica count
follows ``is_hybrid_active``, the wait lists have one entry per collection of the latest cycle,
and nothing is reported for a cycle that has not happened yet). Policy authors can use them in
their own property tests::

    from hypothesis import given
    from dynres.testkit.strategies import schedule_contexts

    @given(schedule_contexts(only_hybrid=True, is_hybrid_active=False))
    def test_colocated_never_stalls(ctx):
        assert MyPolicy().should_activate_after_step(ctx) is True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from hypothesis import strategies as st

from dynres.core.context import ScheduleContext, buffer_samples, step_required_samples
from dynres.core.requests import ReplicaLoad, RequestContext

__all__ = [
    "context_sequences",
    "edge_requests",
    "edge_runs",
    "request_contexts",
    "sample_context",
    "schedule_contexts",
]

# Upper bounds keep the numbers in the range real runs produce; values far beyond them only make
# failures harder to read without exercising different code in a policy.
MAX_REQUIRED_SAMPLES = 1024
MAX_TRIGGER = 8
MAX_REPLICAS = 64
MAX_GLOBAL_STEPS = 5000
MAX_SECONDS = 3600.0
MAX_RATE = 1000.0

_seconds = st.floats(min_value=0.001, max_value=MAX_SECONDS, allow_nan=False, allow_infinity=False)
_rates = st.floats(min_value=0.001, max_value=MAX_RATE, allow_nan=False, allow_infinity=False)


def _maybe_zero(strategy: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    # 0 means "not measured yet" for every duration and rate field, so it gets its own branch.
    return st.one_of(st.just(0.0), strategy)


@st.composite
def _cluster(draw: st.DrawFn, only_hybrid: bool | None, is_hybrid_active: bool | None) -> dict[str, Any]:
    """Draw the facts that stay fixed during a run: batch shape and replica counts."""
    if only_hybrid is None:
        only_hybrid = draw(st.booleans())
    if only_hybrid:
        standalone = 0
        hybrid = draw(st.integers(1, MAX_REPLICAS))
    else:
        standalone = draw(st.integers(1, MAX_REPLICAS))
        # A cluster without hybrid replicas (dynamic scheduling off) is valid too.
        hybrid = draw(st.integers(0 if is_hybrid_active is not True else 1, MAX_REPLICAS))
    return {
        "required_samples": draw(st.integers(1, MAX_REQUIRED_SAMPLES)),
        "trigger_parameter_sync_step": draw(st.integers(1, MAX_TRIGGER)),
        "staleness_threshold": draw(
            st.one_of(st.just(0.0), st.floats(0.0, 1.0, allow_nan=False), st.sampled_from([0.1, 0.5]))
        ),
        "num_standalone_replicas": standalone,
        "num_hybrid_replicas": hybrid,
        "partial_rollout": draw(st.booleans()),
        "shared_host": draw(st.booleans()),
    }


@st.composite
def _cycle_state(
    draw: st.DrawFn,
    cluster: dict[str, Any],
    global_steps: int,
    is_hybrid_active: bool | None,
    total_generated_floor: int = 0,
) -> ScheduleContext:
    """Draw the per-cycle numbers for ``cluster`` at ``global_steps`` and build the context."""
    required = cluster["required_samples"]
    trigger = cluster["trigger_parameter_sync_step"]
    step_required = step_required_samples(required, trigger)
    buffer = buffer_samples(step_required, cluster["staleness_threshold"])
    standalone, hybrid = cluster["num_standalone_replicas"], cluster["num_hybrid_replicas"]
    expected = step_required * global_steps

    active = hybrid > 0 and draw(st.booleans()) if is_hybrid_active is None else is_hybrid_active and hybrid > 0
    num_active = standalone + (hybrid if active else 0)

    # Production can lag the trainer (negative surplus, the trainer waits) or run ahead of it by
    # at most one cycle plus the staleness buffer (the rollouter stops there).
    low = max(total_generated_floor, 0)
    high = max(low, expected + step_required + buffer)
    total_generated = draw(st.integers(low, high))
    surplus = total_generated - expected
    # Stale samples may have been dropped, so the queue holds at most the surplus.
    queue_size = draw(st.integers(0, max(0, surplus)))
    in_flight = draw(st.integers(0, num_active * 32)) if num_active else 0

    # 0 = unknown length; otherwise the run ends at or after this cycle.
    total_steps = draw(st.one_of(st.just(0), st.integers(max(1, global_steps), global_steps + 100)))
    # Nothing has been measured before the first cycle ends: every measured field keeps its default.
    new_samples = max(0, total_generated - total_generated_floor)
    measured = draw(_measured_cycle(cluster, new_samples)) if global_steps > 0 else {}
    cycle_s = measured.get("last_cycle_time_s", 0.0)
    now = draw(st.floats(0.0, 10.0 * MAX_SECONDS, allow_nan=False)) + global_steps * cycle_s

    return ScheduleContext(
        global_steps=global_steps,
        now=now,
        required_samples=required,
        trigger_parameter_sync_step=trigger,
        staleness_threshold=cluster["staleness_threshold"],
        partial_rollout=cluster["partial_rollout"],
        shared_host=cluster["shared_host"],
        total_generated_samples=total_generated,
        expected_samples=expected,
        queue_size=queue_size,
        in_flight_samples=in_flight,
        is_hybrid_active=active,
        num_standalone_replicas=standalone,
        num_hybrid_replicas=hybrid,
        num_active_replicas=num_active,
        total_steps=total_steps,
        **measured,
    )


@st.composite
def _measured_cycle(draw: st.DrawFn, cluster: dict[str, Any], new_samples: int) -> dict[str, Any]:
    """Draw what the runtime measured over a finished cycle of ``cluster`` that produced
    ``new_samples`` samples: waits, switch and sync times, rates, and the hybrids' share."""
    required = cluster["required_samples"]
    trigger = cluster["trigger_parameter_sync_step"]
    wait_samples = tuple(draw(st.lists(st.integers(0, required), min_size=trigger, max_size=trigger)))
    # A collection waits a positive time exactly when it had samples to wait for.
    wait_times = tuple(draw(_seconds) if n > 0 else 0.0 for n in wait_samples)
    activate_s = draw(_maybe_zero(st.floats(0.001, 600.0, allow_nan=False)))
    deactivate_s = draw(_maybe_zero(st.floats(0.001, 600.0, allow_nan=False)))
    gen_rate = draw(_maybe_zero(_rates))
    cons_rate = draw(_maybe_zero(_rates))
    train_s = draw(_maybe_zero(_seconds))
    cycle_s = train_s + sum(wait_times) + draw(_maybe_zero(_seconds))
    sync_s = draw(_maybe_zero(st.floats(0.001, 60.0, allow_nan=False)))
    hybrid_s = 0.0
    hybrid_generated = hybrid_tokens = standalone_tokens = 0
    if cluster["num_hybrid_replicas"] > 0 and cycle_s > 0 and draw(st.booleans()):
        # Hybrid replicas generated for part of the cycle and finished some of its samples.
        hybrid_s = draw(st.floats(0.0, cycle_s, allow_nan=False))
        hybrid_generated = draw(st.integers(0, new_samples))
        hybrid_tokens = draw(st.one_of(st.just(0), st.integers(1, 10**10)))
    if cluster["num_standalone_replicas"] > 0:
        standalone_tokens = draw(st.one_of(st.just(0), st.integers(1, 10**10)))
    return {
        "step_wait_times": wait_times,
        "step_wait_samples": wait_samples,
        "last_activate_duration_s": activate_s,
        "last_deactivate_duration_s": deactivate_s,
        "generation_rate": gen_rate,
        "consumption_rate": cons_rate,
        "last_train_time_s": train_s,
        "last_cycle_time_s": cycle_s,
        "last_hybrid_active_s": hybrid_s,
        "last_hybrid_generated_samples": hybrid_generated,
        "last_hybrid_tokens": hybrid_tokens,
        "last_standalone_tokens": standalone_tokens,
        "last_sync_s": sync_s,
    }


def schedule_contexts(
    *,
    only_hybrid: bool | None = None,
    is_hybrid_active: bool | None = None,
    first_cycle: bool | None = None,
) -> st.SearchStrategy[ScheduleContext]:
    """Strategy for valid, self-consistent ScheduleContexts; pin a property with a keyword.

    ``only_hybrid`` fixes whether the cluster has standalone replicas, ``is_hybrid_active``
    whether hybrid replicas are generating (True implies at least one hybrid replica),
    ``first_cycle`` whether the context is from before the first weight sync (``global_steps=0``).
    ``None`` lets the strategy choose.
    """
    if first_cycle is None:
        steps = st.one_of(st.just(0), st.integers(1, 10), st.integers(1, MAX_GLOBAL_STEPS))
    elif first_cycle:
        steps = st.just(0)
    else:
        steps = st.integers(1, MAX_GLOBAL_STEPS)
    return st.tuples(_cluster(only_hybrid, is_hybrid_active), steps).flatmap(
        lambda pair: _cycle_state(pair[0], pair[1], is_hybrid_active)
    )


@st.composite
def context_sequences(
    draw: st.DrawFn,
    *,
    min_size: int = 1,
    max_size: int = 8,
    only_hybrid: bool | None = None,
) -> list[ScheduleContext]:
    """Strategy for the contexts of consecutive sync cycles of one run (same cluster, steps +1).

    ``total_generated_samples`` never decreases and ``global_steps`` counts up from a drawn start,
    so a stateful policy sees a plausible history. Use it to drive ``update_after_step``.
    """
    cluster = draw(_cluster(only_hybrid, None))
    start = draw(st.one_of(st.just(0), st.integers(0, 50)))
    size = draw(st.integers(min_size, max_size))
    contexts: list[ScheduleContext] = []
    generated = 0
    for offset in range(size):
        ctx = draw(_cycle_state(cluster, start + offset, None, total_generated_floor=generated))
        generated = ctx.total_generated_samples
        contexts.append(ctx)
    return contexts


_Cycle = Callable[[int, int, dict[str, Any]], dict[str, Any]]
"""Builds cycle ``k``'s context fields from ``(k, step_required, cluster)``."""

EDGE_RUN_CYCLES = 8
"""Contexts in each of :func:`edge_runs` (the first sync and seven more)."""


def edge_runs(*, only_hybrid: bool | None = None) -> list[list[ScheduleContext]]:
    """Hand-built runs whose cycles all push a policy's learned state the same way (lists of contexts).

    :func:`context_sequences` draws every cycle on its own, so an adaptive estimate (a learned
    correction, a cap, a counter) seldom moves far in one direction within a run, and the code
    that bounds it seldom runs. The conformance checks try these runs before the generated ones
    (hypothesis explicit examples), so a defect at such a bound shows on every run and machine.
    Each holds ``EDGE_RUN_CYCLES`` contexts from the first sync on:

    * ``starved``: every collection waits for all of its samples, while the hybrid replicas
      generate for half of each cycle;
    * ``slowing_sync``: the trainer never waits, and from the fourth sync on the weight sync
      takes 60 s instead of 1 s (a sync that drains running samples, as without partial rollout);
    * ``flooded``: the queue holds all the staleness budget allows, the hybrid replicas stay
      active, and the run's length is known (the last context is its final sync);
    * ``colocated``: the starved run on a cluster without standalone replicas, on one shared host.

    ``only_hybrid`` keeps the runs of that kind of cluster (None: all of them).
    """
    mixed = {"num_standalone_replicas": 2, "num_hybrid_replicas": 2, "required_samples": 8}
    runs = [
        _edge_run({**mixed, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5}, _starved),
        # Staleness 0 without partial rollout: each sync waits for the running samples.
        _edge_run(
            {**mixed, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.0, "partial_rollout": False},
            _slowing_sync,
        ),
        _edge_run({**mixed, "trigger_parameter_sync_step": 2, "staleness_threshold": 0.5}, _flooded, known_length=True),
        _edge_run(
            {
                "num_standalone_replicas": 0,
                "num_hybrid_replicas": 4,
                "required_samples": 8,
                "trigger_parameter_sync_step": 2,
                "staleness_threshold": 0.1,
                # On one host too: with no standalone replica the hybrids are the only producers.
                "shared_host": True,
            },
            _starved,
        ),
    ]
    return [run for run in runs if only_hybrid is None or run[0].only_hybrid == only_hybrid]


def _edge_run(cluster: dict[str, Any], cycle: _Cycle, *, known_length: bool = False) -> list[ScheduleContext]:
    """The contexts of a run on ``cluster`` whose cycle ``k`` is ``cycle(k, step_required, cluster)``
    (a dict of context fields; queue and hybrid state only at ``k = 0``, where nothing is measured)."""
    step_required = step_required_samples(cluster["required_samples"], cluster["trigger_parameter_sync_step"])
    contexts: list[ScheduleContext] = []
    now = 0.0
    for step in range(EDGE_RUN_CYCLES):
        fields = cycle(step, step_required, cluster)
        if step == 0:
            fields = {k: fields[k] for k in ("queue_size", "is_hybrid_active") if k in fields}
        queue = fields.pop("queue_size", 0)
        active = fields.pop("is_hybrid_active", False)
        now += fields.get("last_cycle_time_s", 0.0)
        replicas = cluster["num_standalone_replicas"] + (cluster["num_hybrid_replicas"] if active else 0)
        contexts.append(
            ScheduleContext(
                **cluster,
                **fields,
                global_steps=step,
                now=now,
                total_steps=EDGE_RUN_CYCLES - 1 if known_length else 0,
                expected_samples=step_required * step,
                total_generated_samples=step_required * step + queue,
                queue_size=queue,
                in_flight_samples=2 * replicas,
                is_hybrid_active=active,
                num_active_replicas=replicas,
            )
        )
    return contexts


def _measured(
    cluster: dict[str, Any],
    step_required: int,
    *,
    waits: float = 0.0,
    sync_s: float = 2.0,
    hybrid_s: float = 0.0,
    hybrid_samples: int = 0,
) -> dict[str, Any]:
    """One finished cycle: 100 s of training, ``waits`` seconds per collection for all of its
    samples, the sync, and ``hybrid_samples`` of the cycle's samples made by the hybrid replicas."""
    trigger, train_s = cluster["trigger_parameter_sync_step"], 100.0
    cycle_s = train_s + trigger * waits + sync_s
    tokens = 1000  # per sample
    return {
        "step_wait_times": (waits,) * trigger,
        "step_wait_samples": ((cluster["required_samples"] if waits else 0),) * trigger,
        "last_activate_duration_s": 5.0 if hybrid_s else 0.0,
        "last_deactivate_duration_s": 3.0 if hybrid_s else 0.0,
        "generation_rate": step_required / cycle_s,
        "consumption_rate": step_required / train_s,
        "last_train_time_s": train_s,
        "last_cycle_time_s": cycle_s,
        "last_sync_s": sync_s,
        "last_hybrid_active_s": hybrid_s,
        "last_hybrid_generated_samples": hybrid_samples,
        "last_hybrid_tokens": hybrid_samples * tokens,
        "last_standalone_tokens": (step_required - hybrid_samples) * tokens
        if cluster["num_standalone_replicas"]
        else 0,
    }


def _starved(step: int, step_required: int, cluster: dict[str, Any]) -> dict[str, Any]:
    hybrid_s = 0.5 * (100.0 + cluster["trigger_parameter_sync_step"] * 40.0)
    samples = step_required if not cluster["num_standalone_replicas"] else step_required // 3
    return _measured(cluster, step_required, waits=40.0, hybrid_s=hybrid_s, hybrid_samples=samples)


def _slowing_sync(step: int, step_required: int, cluster: dict[str, Any]) -> dict[str, Any]:
    sync_s = 1.0 if step < 4 else 60.0
    return {"queue_size": 4, **_measured(cluster, step_required, sync_s=sync_s, hybrid_s=30.0, hybrid_samples=4)}


def _flooded(step: int, step_required: int, cluster: dict[str, Any]) -> dict[str, Any]:
    queue = step_required + buffer_samples(step_required, cluster["staleness_threshold"])
    fields = _measured(cluster, step_required, hybrid_s=102.0, hybrid_samples=step_required // 2)
    return {"queue_size": queue, "is_hybrid_active": True, **fields}


def sample_context(**overrides: Any) -> ScheduleContext:
    """A plausible mid-run context (8 standalone + 8 hybrid replicas, step 3); override any field.

    The numbers describe a cycle in which the trainer waited for samples and hybrid replicas are
    generating. Derived fields (``expected_samples``, ``num_active_replicas``) follow overrides of
    the fields they are derived from unless given explicitly.
    """
    values: dict[str, Any] = {
        "global_steps": 3,
        "now": 1260.0,
        "required_samples": 32,
        "trigger_parameter_sync_step": 4,
        "staleness_threshold": 0.1,
        "queue_size": 6,
        "in_flight_samples": 120,
        "step_wait_times": (42.0, 0.0, 18.5, 7.25),
        "step_wait_samples": (20, 0, 9, 3),
        "is_hybrid_active": True,
        "num_standalone_replicas": 8,
        "num_hybrid_replicas": 8,
        "last_activate_duration_s": 6.5,
        "last_deactivate_duration_s": 4.0,
        "generation_rate": 0.31,
        "consumption_rate": 1.6,
        "last_train_time_s": 80.0,
        "last_cycle_time_s": 420.0,
    }
    values.update(overrides)
    step_required = step_required_samples(values["required_samples"], values["trigger_parameter_sync_step"])
    values.setdefault("expected_samples", step_required * values["global_steps"])
    values.setdefault("total_generated_samples", values["expected_samples"] + values["queue_size"])
    hybrid_on = values["is_hybrid_active"]
    values.setdefault(
        "num_active_replicas",
        values["num_standalone_replicas"] + (values["num_hybrid_replicas"] if hybrid_on else 0),
    )
    return ScheduleContext(**values)


# ---- Request contexts (the per-request decisions predict_length and route) -----------------------

MAX_TOKENS = 32768
"""Longest response the request strategies draw (tokens)."""


@st.composite
def request_contexts(draw: st.DrawFn, *, max_replicas: int = 8) -> RequestContext:
    """Strategy for valid RequestContexts: 1 to ``max_replicas`` routable replicas of either kind,
    a new or resumed request, 0 to 8 finished siblings and 0 to 8 earlier lengths of its prompt."""
    n = draw(st.integers(1, max_replicas))
    kind: st.SearchStrategy[Literal["standalone", "hybrid"]] = st.sampled_from(["standalone", "hybrid"])
    kinds = draw(st.lists(kind, min_size=n, max_size=n))
    loads = draw(st.lists(st.integers(0, 256), min_size=n, max_size=n))
    max_tokens = draw(st.integers(1, MAX_TOKENS))
    return RequestContext(
        request_id=f"s{draw(st.integers(0, 10**6))}-{draw(st.integers(0, 15))}",
        sample_id="s0",
        prompt_tokens=draw(st.integers(1, 4096)),
        generated_tokens=draw(st.integers(0, max_tokens - 1)),
        max_tokens=max_tokens,
        attempt=draw(st.integers(0, 8)),
        sibling_lengths=tuple(draw(st.lists(st.integers(1, max_tokens), max_size=8))),
        replicas=tuple(
            ReplicaLoad(f"{kind}-{i}", kind, load) for i, (kind, load) in enumerate(zip(kinds, loads, strict=True))
        ),
        now=draw(st.floats(0.0, 1e6, allow_nan=False)),
        prompt_id=draw(st.none() | st.sampled_from(["p0", "p1"])),
        prompt_lengths=tuple(draw(st.lists(st.integers(1, max_tokens), max_size=8))),
        partial_rollout=draw(st.booleans()),
    )


def edge_requests(ctx: ScheduleContext) -> list[RequestContext]:
    """Requests routed during the cycle ``ctx`` reports on, one of each kind a policy must answer:
    new and resumed, with and without finished siblings or earlier lengths of the prompt, over the
    cycle's routable replicas (standalone ones, plus the hybrid ones while they are active), with
    uneven loads."""
    replicas = [ReplicaLoad(f"standalone-{i}", "standalone", (7 * i) % 5) for i in range(ctx.num_standalone_replicas)]
    if ctx.is_hybrid_active or not replicas:
        replicas += [ReplicaLoad(f"hybrid-{i}", "hybrid", (3 * i) % 4) for i in range(max(1, ctx.num_hybrid_replicas))]

    def request(
        rid: str,
        generated: int,
        attempt: int,
        siblings: tuple[int, ...],
        predicted: float | None = None,
        prompt: tuple[int, ...] = (),
    ) -> RequestContext:
        return RequestContext(
            request_id=rid,
            sample_id=f"s{ctx.global_steps}",
            prompt_tokens=512,
            generated_tokens=generated,
            max_tokens=8192,
            attempt=attempt,
            sibling_lengths=siblings,
            replicas=tuple(replicas),
            now=ctx.now,
            predicted_tokens=predicted,
            prompt_id="p0" if prompt else None,
            prompt_lengths=prompt,
            partial_rollout=not prompt,  # the request with a history is also one whose cut loses its work
        )

    return [
        request("new", 0, 0, ()),
        request("resumed", 3000, 2, ()),
        request("sibling", 0, 0, (40, 7000, 8192)),
        request("predicted", 100, 1, (1,), predicted=0.0),
        request("seen-prompt", 0, 0, (), prompt=(8192, 12, 8192)),
    ]
