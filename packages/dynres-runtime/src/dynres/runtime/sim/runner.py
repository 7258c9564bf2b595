"""``simulate(scenario)``: the real fully-async runtime on a virtual-time loop with the sim backend.

Nothing here forks the runtime: :func:`dynres.runtime.loop.driver.run_fully_async` drives the same
controller, balancer, queue, loops and policy code as a real run. The simulator only supplies
:class:`~dynres.runtime.sim.virtual_engines.SimReplica` / :class:`~dynres.runtime.sim.virtual_engines.SimTrainEngine`
built from the scenario, a prompt source whose prompt groups carry their modelled response
lengths, and the virtual-time event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynres.core import Policy
from dynres.core.context import buffer_samples
from dynres.core.errors import ScenarioError
from dynres.core.loading import policy_from_config
from dynres.core.metrics import (
    CLUSTER_UTILIZATION,
    MQ_SIZE,
    ROLLOUT_UTILIZATION,
    TRAIN_UTILIZATION,
)
from dynres.runtime.loop.ledger import SampleLedger, held_sample_ids
from dynres.runtime.loop.report import CycleReport, RunReport
from dynres.runtime.protocols import ReplicaKind
from dynres.runtime.samples import PromptGroup
from dynres.runtime.sim.bound import BoundInputs, CycleWork, LowerBound, lower_bound, lower_bound_naive
from dynres.runtime.sim.gap import TrainerTrace, gap_causes
from dynres.runtime.sim.scenario import Scenario, load_scenario
from dynres.runtime.sim.virtual_engines import (
    RESPONSE_TOKENS_KEY,
    SharedHost,
    SimReplica,
    SimReplicaCosts,
    SimTrainCosts,
    SimTrainEngine,
)
from dynres.runtime.sim.virtual_time import run_virtual
from dynres.runtime.sim.workload import (
    LengthOracle,
    host_peak,
    reference_batch_tokens,
    replica_peak,
    request_work,
    train_step_seconds,
)

if TYPE_CHECKING:
    from dynres.core.config import DynresConfig
    from dynres.runtime.loop.driver import RunSpec
    from dynres.runtime.sim.verl_host import VerlTiming

REAL_TIME_KEYS = frozenset({"wall_s", "policy_wall_s"})
"""Report keys measured in real time; left out of the JSON so that it is deterministic."""


@dataclass
class SimResult:
    """A simulated run: the runtime's report plus the lower bound and what was simulated."""

    scenario: Scenario
    """The scenario that ran (after overrides)."""
    policy: str
    """Name of the policy that ran."""
    report: RunReport
    """The runtime's report (same type as a real run's)."""
    bound: LowerBound
    """The tight analytic lower bound of this run's work, switches and syncs counted (seconds)."""
    naive_bound: LowerBound | None = None
    """The naive bound: no switch or sync counted (seconds; None = not computed)."""
    wall_s: float = 0.0
    """Real seconds the simulation took (profiling; not in the JSON)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Simulator counters: tokens, replica work, sleep aborts, the most samples a weight version
    admitted beyond its staleness budget (JSON-serialisable)."""
    ledger: SampleLedger | None = None
    """Where each admitted sample went, by id (not in the JSON; end-to-end checks read it)."""
    host: str = "dynres"
    """Who drove the run: ``dynres`` (the dynres runtime) or ``verl`` (verl's trainer order and controller)."""
    trace: TrainerTrace | None = None
    """The trainer's timeline as the gap decomposition reads it (run clock; not in the JSON)."""

    @property
    def label(self) -> str:
        """``scenario[policy]``: how tables, JSON, plots and summary lines name this run."""
        return run_label(self.scenario.name, self.policy)

    @property
    def queue_cap(self) -> int:
        """Most samples the queue holds: a cycle's samples plus the staleness buffer (count)."""
        step = self.scenario.step_required_samples
        return step + buffer_samples(step, self.scenario.async_training.staleness_threshold)

    @property
    def mq_size_cap(self) -> int:
        """Most samples that can wait after a cycle's last fit step, the reach of ``mq_size`` (count)."""
        from dynres.runtime.loop.spec import mq_size_cap

        return mq_size_cap(self.scenario.dynres_config())

    @property
    def end_to_end_s(self) -> float:
        """Simulated end-to-end time (seconds)."""
        return self.report.end_to_end_s

    @property
    def lower_bound_s(self) -> float:
        """The lower bound on end-to-end time (seconds)."""
        return self.bound.total_s

    @property
    def lower_bound_naive_s(self) -> float:
        """The naive lower bound, which ignores switches and syncs (seconds)."""
        return self.naive_bound.total_s if self.naive_bound is not None else self.bound.total_s

    @property
    def ratio_to_bound(self) -> float:
        """end_to_end_s / lower_bound_s (>= 1)."""
        return self.end_to_end_s / self.lower_bound_s if self.lower_bound_s > 0 else math.inf

    def mean_metric(self, key: str) -> float:
        """Mean of a per-cycle metric over the run (NaN when no cycle has it)."""
        values = [v for v in self.report.metric_series(key) if not math.isnan(v)]
        return sum(values) / len(values) if values else math.nan

    @property
    def switches(self) -> int:
        """Hybrid activations plus deactivations (count)."""
        ops = self.report.operations
        return ops.activations + ops.deactivations

    def summary(self) -> dict[str, Any]:
        """The headline numbers: times, ratio, mean utilizations, switches, mean mq_size."""
        return {
            "end_to_end_s": self.end_to_end_s,
            "end_to_end_h": self.end_to_end_s / 3600,
            "lower_bound_s": self.lower_bound_s,
            "lower_bound_naive_s": self.lower_bound_naive_s,
            "ratio_to_bound": self.ratio_to_bound,
            "mean_train_utilization": self.mean_metric(TRAIN_UTILIZATION),
            "mean_rollout_utilization": self.mean_metric(ROLLOUT_UTILIZATION),
            "mean_resource_utilization": self.mean_metric(CLUSTER_UTILIZATION),
            "switches": self.switches,
            "mean_mq_size": self.mean_metric(MQ_SIZE),
        }

    @property
    def gap_causes(self) -> dict[str, float]:
        """Seconds per cause of ``end_to_end_s - lower_bound_s`` (see :mod:`dynres.runtime.sim.gap`)."""
        return gap_causes(self)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: headline numbers, one entry per step, the full report (NaN -> null)."""
        s = self.scenario
        return _scrub(
            {
                "label": self.label,
                "scenario": s.name,
                "description": s.description,
                "policy": self.policy,
                "host": self.host,
                "seed": s.seed,
                **self.summary(),
                "lower_bound_terms": dict(self.bound.terms),
                "lower_bound_binding": self.bound.binding,
                "gap_causes": self.gap_causes,
                "cluster": s.cluster.model_dump(),
                "steps": [c.to_record() for c in self.report.cycles],
                "sim": dict(self.extra),
                "report": self.report.to_dict(),
            }
        )


def run_label(scenario: str, policy: str) -> str:
    """The label of a run of policy ``policy`` on scenario ``scenario``: ``scenario[policy]``."""
    return f"{scenario}[{policy}]"


def relative_difference(value: float, reference: float) -> float:
    """``(value - reference) / reference``: the one formula for "x% longer/shorter than" (fraction).

    Tables ("vs #1"), summary lines and the JSON's ``vs_first`` all use it, with the first run as
    the reference, so one pair of runs is never described by two different percentages.
    """
    return (value - reference) / reference if reference > 0 else math.nan


def _scrub(v: Any) -> Any:
    # Drop real-time profiling keys (so the JSON is deterministic) and turn NaN/inf into null
    # (so it is strict JSON).
    if isinstance(v, dict):
        return {k: _scrub(x) for k, x in v.items() if k not in REAL_TIME_KEYS}
    if isinstance(v, list):
        return [_scrub(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# ---- Building the simulated cluster ---------------------------------------------------------


def prompt_groups(scenario: Scenario, oracle: LengthOracle) -> Iterator[PromptGroup]:
    """The run's prompt groups: sample ``i`` is ``"s<i>"`` with its modelled response lengths."""
    prompt = range(scenario.workload.prompt_tokens)
    n = scenario.responses_per_sample
    max_tokens = scenario.workload.response.max_tokens
    i = 0
    while True:
        lengths = oracle.sample(i)
        yield PromptGroup(
            sample_id=f"s{i}",
            prompt_token_ids=prompt,
            n=n,
            max_tokens=max_tokens,
            response_extra=[{RESPONSE_TOKENS_KEY: length} for length in lengths],
            prompt_id=oracle.prompt_id(i),
        )
        i += 1


def build_replicas(scenario: Scenario, kind: ReplicaKind, count: int) -> list[SimReplica]:
    """``count`` simulated replicas of ``kind`` with the scenario's speed and costs."""
    d = scenario.workload.decode
    c = scenario.costs
    costs = SimReplicaCosts(
        sleep_s=c.sleep_s, wake_up_s=c.wake_up_s, abort_s=c.abort_s, update_weights_s=c.weight_sync_s
    )
    hybrid = kind is ReplicaKind.HYBRID
    return [
        SimReplica(
            f"{kind.value}-{i}",
            kind,
            peak_tokens_per_s=replica_peak(d, hybrid),
            c_half=d.c_half,
            prefill_cost=d.prefill_cost,
            costs=costs,
            asleep=hybrid,
        )
        for i in range(count)
    ]


def attach_shared_host(scenario: Scenario, replicas: list[SimReplica]) -> SharedHost | None:
    """Put ``replicas`` on one shared host when ``cluster.shared_host`` is set (None otherwise)."""
    if not scenario.cluster.shared_host:
        return None
    host = SharedHost(host_peak(scenario))
    for r in replicas:
        host.attach(r)
    return host


def build_train_engine(scenario: Scenario, on_batch: Callable[[Any, float], None] | None = None) -> SimTrainEngine:
    """The simulated trainer on the scenario's trainer GPUs; ``on_batch(batch, compute_s)`` after each fit step."""
    train = scenario.workload.train
    ref_tokens = reference_batch_tokens(scenario)
    gpus = scenario.cluster.trainer_gpus
    c = scenario.costs

    def seconds(tokens: float) -> float:
        return train_step_seconds(tokens, ref_tokens, train, gpus)

    engine = SimTrainEngine(
        step_seconds=seconds,
        phase_fractions=train.phase_fractions,
        costs=SimTrainCosts(
            offload_s=c.trainer_offload_s, onload_s=c.trainer_onload_s, export_weights_s=c.export_weights_s
        ),
    )
    if on_batch is not None:
        inner = engine.train_step

        async def train_step(batch: Any) -> Any:
            before = engine.compute_s
            result = await inner(batch)
            on_batch(batch, engine.compute_s - before)
            return result

        engine.train_step = train_step  # type: ignore[method-assign]  # wraps this one instance, not the class
    return engine


# ---- Policies --------------------------------------------------------------------------------


def build_policy(scenario: Scenario, policy: str | Policy | type[Policy] | None) -> Policy:
    """The policy to run: ``policy`` if given, else the scenario's, with params from its config."""
    if isinstance(policy, Policy):
        return policy
    return policy_from_config(scenario.async_training, policy)


# ---- simulate() ------------------------------------------------------------------------------


@dataclass
class _Consumption:
    """Sample ids admitted and trained, and the work of each fit step: the lower bound counts
    exactly the work of the samples the trainer consumed, and the ledger checks the ids."""

    prompt_tokens: int
    """Prompt length of every sample (tokens)."""
    prefill_cost: float
    """Decode-token equivalents of one prompt token (see workload.request_work)."""
    admitted: list[str] = field(default_factory=list)
    """Ids the prompt source handed to the rollouter, in order."""
    trained: list[str] = field(default_factory=list)
    """Ids in the batches the trainer received, in order."""
    work: list[float] = field(default_factory=list)
    """Work of each consumed sample, all its responses (token equivalents)."""
    critical: list[float] = field(default_factory=list)
    """Work of each consumed sample's longest response (token equivalents)."""
    fit_steps: list[tuple[float, list[float], list[float]]] = field(default_factory=list)
    """Per fit step: its compute seconds, and the work and critical work of its samples."""
    trace: TrainerTrace | None = None
    """Gets each fit step's times and arrivals too (None: not traced)."""

    def on_batch(self, batch: Any, compute_s: float) -> None:
        """Record one fit step of ``compute_s`` seconds on ``batch`` (the trainer's hook)."""
        works_of_step, critical_of_step = [], []
        for s in batch:
            self.trained.append(s.sample_id)
            works = [request_work(self.prompt_tokens, 0, len(r.token_ids), self.prefill_cost) for r in s.responses]
            works_of_step.append(sum(works))
            critical_of_step.append(max(works))
        self.work.extend(works_of_step)
        self.critical.extend(critical_of_step)
        self.fit_steps.append((compute_s, works_of_step, critical_of_step))
        if self.trace is not None:
            self.trace.record_fit(batch, compute_s)

    def recorded(self, groups: Iterable[PromptGroup]) -> Iterator[PromptGroup]:
        """``groups`` as they are admitted, each id recorded on the way."""
        for g in groups:
            self.admitted.append(g.sample_id)
            yield g


@dataclass
class _SimCluster:
    """The simulated engines of one run."""

    standalone: list[SimReplica]
    """Standalone replicas (always generating)."""
    hybrid: list[SimReplica]
    """Hybrid replicas on the trainer's GPUs (start asleep)."""
    engine: SimTrainEngine
    """The simulated trainer."""

    @property
    def replicas(self) -> list[SimReplica]:
        """Standalone then hybrid replicas."""
        return [*self.standalone, *self.hybrid]


def _build_cluster(sc: Scenario, on_batch: Callable[[Any, float], None]) -> _SimCluster:
    """The scenario's replicas (on one shared host if it says so) and trainer."""
    standalone = build_replicas(sc, ReplicaKind.STANDALONE, sc.num_standalone_replicas)
    hybrid = build_replicas(sc, ReplicaKind.HYBRID, sc.num_hybrid_replicas)
    attach_shared_host(sc, [*standalone, *hybrid])
    return _SimCluster(standalone, hybrid, build_train_engine(sc, on_batch))


def _run_spec(
    sc: Scenario,
    cfg: DynresConfig,
    pol: Policy,
    cluster: _SimCluster,
    prompts: Iterator[PromptGroup],
    progress: Callable[[CycleReport], Any] | None,
) -> RunSpec:
    """The RunSpec of a simulated run: the real runtime's, with no timeouts on modelled durations."""
    from dynres.core import get_plugin_manager
    from dynres.runtime.loop.driver import RunSpec

    return RunSpec(
        config=cfg,
        policy=pol,
        standalone=cluster.standalone,
        hybrid=cluster.hybrid,
        train_engine=cluster.engine,
        prompts=prompts,
        num_cycles=sc.steps,
        progress=progress,
        plugin_manager=get_plugin_manager(),
        seed=sc.seed,
        hybrid_gpus=sc.cluster.trainer_gpus,
        standalone_gpus=sc.cluster.rollout_gpus,
        shared_host=sc.cluster.shared_host,
        # A simulated operation takes exactly its modelled time: a long fit step on the virtual
        # clock is the scenario, not a hung engine, so no operation times out.
        op_timeout_s=math.inf,
        # Nor a stall watchdog: a long simulated fit step is not a stall, and a real deadlock
        # leaves the virtual loop with no timer, which sim.virtual_time reports by itself.
        stall_timeout_s=None,
    )


HOSTS: tuple[str, ...] = ("dynres", "verl")
"""Who drives a simulated run: the dynres runtime's trainer loop, or verl's trainer order and controller."""


def simulate(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    *,
    policy: str | Policy | type[Policy] | None = None,
    seed: int | None = None,
    progress: Callable[[CycleReport], Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    thread_grace_s: float = 5.0,
    host: str = "dynres",
    verl_timing: VerlTiming | None = None,
) -> SimResult:
    """Simulate ``scenario`` (preset name, YAML path, mapping or Scenario) and return the result.

    :param policy: a policy name, ``module:Class``, ``file.py:Class``, class or instance
        (default: the scenario's ``async_training.dynamic_schedule_policy``); with
        ``host="verl"`` a name in verl's registry (``dynres:<name>``, or verl's own ``default``).
    :param seed: replaces the scenario's seed (response lengths and routing tie-breaks).
    :param progress: called after each sync cycle with its CycleReport.
    :param overrides: dotted keys to set before validation (what ``--set`` passes).
    :param thread_grace_s: real seconds a policy call may hold the virtual clock (see sim.virtual_time).
    :param host: ``dynres`` (the dynres runtime) or ``verl`` (verl's controller in verl's trainer
        order over the same engines, see :mod:`dynres.runtime.sim.verl_host`).
    :param verl_timing: with ``host="verl"``, whose timing the trainer keeps (a
        ``verl_host.VerlTiming``; None: verl's own).
    """
    from dynres.runtime.loop.driver import FullyAsyncRun

    if host not in HOSTS:
        raise ScenarioError(f"unknown host {host!r}; choose one of {', '.join(HOSTS)}")
    sc = load_scenario(scenario, overrides=overrides)
    if seed is not None:
        sc = sc.model_copy(update={"seed": seed})
    cfg = sc.dynres_config()
    hosted = _VerlHosting(sc, policy, verl_timing) if host == "verl" else None
    pol = hosted.placeholder if hosted is not None else build_policy(sc, policy)
    oracle = LengthOracle(
        sc.workload.response,
        n=sc.responses_per_sample,
        step_required_samples=sc.step_required_samples,
        seed=sc.seed,
    )
    consumption = _Consumption(sc.workload.prompt_tokens, sc.workload.decode.prefill_cost)
    cluster = _build_cluster(sc, consumption.on_batch)
    trace = _traced(cluster, consumption)
    spec = _run_spec(sc, cfg, pol, cluster, consumption.recorded(prompt_groups(sc, oracle)), progress)
    if hosted is not None:
        spec.trainer_loop = hosted.trainer_loop(sc.steps)
    t0 = time.perf_counter()
    with hosted.running() if hosted is not None else contextlib.nullcontext():
        run = FullyAsyncRun(spec)
        report = run_virtual(run.run(), thread_grace_s=thread_grace_s)
    wall = time.perf_counter() - t0
    if report.stopped_early:
        raise ScenarioError(f"scenario {sc.name!r}: the simulated run stopped early: {report.stopped_early}")
    ledger = SampleLedger(
        admitted=consumption.admitted,
        trained=consumption.trained,
        left=held_sample_ids(run),
        dropped=run.queue.dropped_ids,
    )
    label = hosted.label if hosted is not None else pol.name
    result = _result(sc, label, report, cluster, consumption, wall, ledger, run.rollouter.most_extra_samples)
    result.trace = trace.on_run_clock(run.clock.start or 0.0)
    if hosted is None:
        return result
    report.policy = hosted.label
    return dataclasses.replace(result, host=host)


def _traced(cluster: _SimCluster, consumption: _Consumption) -> TrainerTrace:
    """A trace of the trainer's timeline, recorded through wrappers of these instances (sim.gap)."""
    trace = TrainerTrace()
    consumption.trace = trace
    trace.trace(cluster.engine, "export_weights", trace.export)
    trace.trace(cluster.engine, "offload", trace.trainer_switch)
    trace.trace(cluster.engine, "onload", trace.trainer_switch)
    for r in cluster.standalone:
        trace.trace(r, "update_weights", trace.standalone_load)
    return trace


class _VerlHosting:
    """What a ``host="verl"`` run changes: verl's policy by its registry name, verl's trainer loop."""

    def __init__(self, sc: Scenario, policy: str | Policy | type[Policy] | None, timing: VerlTiming | None) -> None:
        from dynres.runtime.sim import verl_host

        if policy is not None and not isinstance(policy, str):
            raise ScenarioError(
                "host verl builds its policy from verl's registry: name it (dynres:<name>, or verl's own default)"
            )
        at = sc.async_training
        if not at.use_dynamic_resource_scheduling:
            raise ScenarioError(
                f"host verl: scenario {sc.name!r} has async_training.use_dynamic_resource_scheduling: "
                "false, and verl builds no dynamic-schedule policy then; set it to true"
            )
        self.name = policy or at.dynamic_schedule_policy
        """The policy's name in verl's registry (``verl:<name>`` accepted for verl's own)."""
        verl_host.check_verl_policy(self.name)
        self.label = verl_host.host_label(self.name)
        """How the run is labelled (verl's own policies as ``verl:<name>``)."""
        self.placeholder = verl_host.VerlHosted()
        """What the dynres runtime holds as its policy; never asked."""
        self.params = dict(at.dynamic_schedule_policy_params or {})
        """The scenario's policy params (a dynres policy gets them through dynres-verl)."""
        self.ratio = at.dynamic_schedule_deactivate_ratio
        """verl's dynamic_schedule_deactivate_ratio."""
        self.timing = timing if timing is not None else verl_host.VERL_TIMING
        """Whose timing the trainer keeps (verl's unless a test asks for the dynres runtime's)."""

    def trainer_loop(self, total_steps: int) -> Callable[..., Any]:
        """The RunSpec's trainer-loop factory: verl's trainer order around verl's controller and policy."""
        from dynres.runtime.sim import verl_host

        return functools.partial(
            verl_host.VerlTrainerLoop,
            verl_policy=self.name,
            total_steps=total_steps,
            deactivate_ratio=self.ratio,
            policy_params=self.params,
            timing=self.timing,
        )

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """While the run is built and runs: verl's ``ray`` is the stand-ins' shim, its printing is kept off stdout."""
        from dynres.runtime.sim import verl_host

        with verl_host.verl_without_ray(), contextlib.redirect_stdout(io.StringIO()):
            yield


def _result(
    sc: Scenario,
    policy: str,
    report: RunReport,
    cluster: _SimCluster,
    consumption: _Consumption,
    wall_s: float,
    ledger: SampleLedger,
    extra_admitted: int,
) -> SimResult:
    """The SimResult of a finished run: its report, both lower bounds and the simulator's counters."""
    bound_inputs = bound_inputs_for(
        sc, consumption.fit_steps, consumption.work, consumption.critical, extra_admitted=extra_admitted
    )
    replicas = cluster.replicas
    extra = {
        "replica_work_tokens": sum(r.work_done for r in replicas),
        "decode_tokens": sum(r.decode_tokens for r in replicas),
        "consumed_work_tokens": sum(consumption.work),
        "train_compute_s": cluster.engine.compute_s,
        "train_tokens": cluster.engine.tokens,
        "sleep_aborts": sum(r.sleep_aborts for r in replicas),
        "extra_admitted_samples": extra_admitted,
        **lost_work_tokens(replicas, consumption, ledger.dropped),
    }
    return SimResult(
        scenario=sc,
        policy=policy,
        report=report,
        bound=lower_bound(bound_inputs),
        naive_bound=lower_bound_naive(bound_inputs),
        wall_s=wall_s,
        extra=extra,
        ledger=ledger,
    )


def lost_work_tokens(
    replicas: Sequence[SimReplica], consumption: _Consumption, dropped: Sequence[str]
) -> dict[str, float]:
    """Generation work thrown away (decode-token equivalents): ``rework_tokens``, served to trained
    samples beyond what they needed (re-prefill after aborts, restarts); ``stale_drop_work_tokens``,
    served to samples dropped as too stale; ``lost_work_tokens``, both (sim.gap reads it)."""
    served: dict[str, float] = {}
    for r in replicas:
        for request_id, work in r.work_by_request.items():
            sample = request_id.rsplit("/", 1)[0]  # request ids are "<sample_id>/<i>" (samples.PromptGroup)
            served[sample] = served.get(sample, 0.0) + work
    extra = (served.get(i, 0.0) - w for i, w in zip(consumption.trained, consumption.work, strict=True))
    # Served and needed work are summed in different orders: a difference within float rounding is none.
    rework = sum(x for x in extra if x > 1e-6)
    drop = sum(served.get(i, 0.0) for i in dropped)
    return {"rework_tokens": rework, "stale_drop_work_tokens": drop, "lost_work_tokens": rework + drop}


def bound_inputs_for(
    sc: Scenario,
    fit_steps: list[tuple[float, list[float], list[float]]],
    consumed_work: list[float],
    consumed_critical: list[float],
    extra_admitted: int = 0,
) -> BoundInputs:
    """The lower bound's inputs: the scenario's machine and costs, and the work its fit steps consumed.

    ``extra_admitted``: the most samples the run admitted per weight version beyond the staleness
    budget (the rollouter's ``most_extra_samples``); more samples may then cross each sync.
    """
    d = sc.workload.decode
    c = sc.costs
    gpr = sc.cluster.gpus_per_replica
    trigger = sc.async_training.trigger_parameter_sync_step
    cycles = [
        CycleWork(
            train_step_s=[t for t, _, _ in group],
            sample_work=[w for _, ws, _ in group for w in ws],
            sample_critical_work=[w for _, _, ws in group for w in ws],
        )
        for group in (fit_steps[i : i + trigger] for i in range(0, len(fit_steps) - trigger + 1, trigger))
    ]
    from dynres.runtime.loop.driver import max_required_samples

    return BoundInputs(
        trainer_gpus=sc.cluster.trainer_gpus,
        rollout_gpus=sc.cluster.rollout_gpus,
        train_step_s=[t for t, _, _ in fit_steps],
        sample_work=consumed_work,
        sample_critical_work=consumed_critical,
        peak_tokens_per_gpu_s=d.peak_tokens_per_s / gpr,
        lone_request_tokens_per_s=d.peak_tokens_per_s / (1.0 + d.c_half),
        required_samples=sc.required_samples,
        hybrid_gpus=sc.num_hybrid_replicas * gpr,
        hybrid_speed_factor=d.hybrid_speed_factor,
        shared_host=sc.cluster.shared_host,
        cycles=cycles,
        step_required_samples=sc.step_required_samples,
        max_required_samples=max_required_samples(sc.dynres_config()) + extra_admitted,
        export_s=c.export_weights_s,
        standalone_update_s=c.weight_sync_s if sc.num_standalone_replicas > 0 else 0.0,
        activate_s=c.trainer_offload_s + c.wake_up_s + c.weight_sync_s,
        deactivate_s=c.abort_s + c.sleep_s + c.trainer_onload_s,
    )
