"""``dynres run CONFIG``: a whole real run (cluster, engines, policy, prompts) from one YAML file.

The file is a :class:`~dynres.core.config.DynresConfig` (verl's ``async_training``,
``actor_rollout_ref``, ``rollout`` and ``trainer`` sections, unchanged) plus five sections of
its own::

    run:      {steps: 12, seed: 0}                       # sync cycles to train
    cluster:  {address: null, slot: {CPU: 0.25}}         # Ray: local or an existing cluster
    engines:  {runtime: ray, rollout: vllm, trainer: torch, rollout_options: {...}}
    model:    {path: null, tiny: {hidden_size: 64}}      # null path: a random tiny Qwen2
    task:     {num_prompts: 64, prompt_length: 8, max_tokens: 16}

Every section is strict (``extra="forbid"``): a typo is one error line naming the key and the
nearest valid one. :func:`execute` starts everything, runs ``run.steps`` sync cycles through
:func:`dynres.runtime.loop.run.run_fully_async`, streams one JSONL record per cycle, and tears
everything down, also on Ctrl-C (in-flight work aborted, engines shut down, Ray stopped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, create_model, model_validator

from dynres.core.config import DynresConfig, StrictModel, apply_overrides, read_yaml, validate_model
from dynres.core.errors import ConfigError, DynresError
from dynres.runtime.backends.ray.cluster import RayClusterConfig
from dynres.runtime.protocols import ReplicaKind, TrainStepResult

logger = logging.getLogger("dynres.runtime.realrun")

METRICS_FILE = "metrics.jsonl"
"""One JSON record per sync cycle (``dynamic_resource/*`` keys, train metrics, counters)."""
REPORT_FILE = "report.json"
"""The RunReport (same payload as ``dynres run --json``)."""
BACKEND_FILE = "backend.json"
"""Where things ran: nodes, engine start times, event-loop lag of every actor, lost replicas."""
CYCLE_MEAN_PREFIX = "cycle_mean/"
"""Prefix of train metrics averaged over all fit steps of a cycle (the report keeps the last)."""


# ---- Config ----------------------------------------------------------------------------------


class RunSection(StrictModel):
    """The ``run`` section: how long to train and the run-level knobs."""

    steps: int = Field(..., ge=1, description="Sync cycles (weight syncs) to train (count).")
    seed: int = Field(0, description="Seed of prompts, the tiny model, engines and routing.")
    op_timeout_s: float = Field(600.0, gt=0, description="Longest one engine operation may take (seconds).")
    policy_timeout_s: float = Field(10.0, gt=0, description="Longest one policy decision may take (seconds).")
    sleep_level: int = Field(1, ge=1, le=2, description="Replica.sleep level on deactivation (1 keeps weights in CPU).")


class EnginesSection(StrictModel):
    """The ``engines`` section: where engines run and which ones."""

    runtime: Literal["ray", "local"] = Field(
        "ray", description="'ray': every engine in its own Ray actor; 'local': all in this process."
    )
    rollout: Literal["vllm", "fake"] = Field("fake", description="Inference engine of every replica.")
    trainer: Literal["torch", "fake"] = Field("fake", description="Train engine.")
    rollout_options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of every replica (VllmReplicaConfig / FakeReplica)."
    )
    hybrid_options: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of rollout_options for hybrid replicas only."
    )
    trainer_options: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the train engine.")


def _tiny_spec_model() -> type[StrictModel]:
    """A strict pydantic model of TinyModelSpec's fields (so `model.tiny` typos are caught)."""
    from dynres.runtime.realrun.tiny_task import TinyModelSpec

    hints = typing.get_type_hints(TinyModelSpec)
    fields = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(TinyModelSpec)}
    return create_model("TinyModelSection", __base__=StrictModel, **fields)  # type: ignore[call-overload]


TinyModelSection = _tiny_spec_model()
"""The ``model.tiny`` section: TinyModelSpec's fields (vocab_size, hidden_size, ...), strict."""


class ModelSection(StrictModel):
    """The ``model`` section: a checkpoint directory, or a random tiny Qwen2 built at run time."""

    path: str | None = Field(
        None, description="HF-layout model directory visible on every node; null builds a tiny random Qwen2."
    )
    tiny: TinyModelSection = Field(  # type: ignore[valid-type]
        default_factory=TinyModelSection, description="Shape of the random model (TinyModelSpec fields)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of the tiny model.")


class TaskSection(StrictModel):
    """The ``task`` section: the toy verifiable task (rule token + parity reward)."""

    num_prompts: int = Field(64, ge=1, description="Distinct prompts, cycled over (count).")
    prompt_length: int = Field(8, ge=2, description="Tokens per prompt, rule token included (count).")
    max_tokens: int = Field(16, ge=1, description="Tokens per response at most (count).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")


class RunConfig(DynresConfig):
    """A ``dynres run`` file: the DynresConfig sections plus run, cluster, engines, model, task."""

    run: RunSection = Field(..., description="How long to train.")
    cluster: RayClusterConfig = Field(default_factory=RayClusterConfig, description="Where Ray runs.")
    engines: EnginesSection = Field(default_factory=EnginesSection, description="Which engines, where.")
    model: ModelSection = Field(default_factory=ModelSection, description="The model.")
    task: TaskSection = Field(default_factory=TaskSection, description="The toy task.")

    @model_validator(mode="after")
    def _run_checks(self) -> RunConfig:
        if self.model.tiny.model_fields_set and self.model.path is not None:
            raise ValueError("model.tiny shapes a random model, but model.path names a checkpoint; drop one")
        spec = self.tiny_spec()
        if self.model.path is None and self.task.prompt_length + self.task.max_tokens > spec.max_position_embeddings:
            raise ValueError(
                f"task.prompt_length + task.max_tokens = {self.task.prompt_length + self.task.max_tokens} "
                f"exceeds the tiny model's max_position_embeddings={spec.max_position_embeddings}; "
                "shorten the task or raise model.tiny.max_position_embeddings"
            )
        return self

    def tiny_spec(self) -> Any:
        """The TinyModelSpec of the random model (defaults + ``model.tiny``)."""
        from dynres.runtime.realrun.tiny_task import TinyModelSpec

        return TinyModelSpec(**self.model.tiny.model_dump())

    def dynres_config(self) -> DynresConfig:
        """The plain DynresConfig part (what the runtime reads)."""
        return DynresConfig.model_validate(self.model_dump(include=set(DynresConfig.model_fields)))

    @property
    def needs_model(self) -> bool:
        """True when an engine loads real weights (vLLM or torch)."""
        return self.engines.rollout == "vllm" or self.engines.trainer == "torch"


def load_run_config(source: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Load and validate a run file (or mapping); ``overrides`` are dotted keys, e.g. {"run.steps": 2}."""
    data = source if isinstance(source, Mapping) else read_yaml(source)
    name = "config" if isinstance(source, Mapping) else str(source)
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"{name}: expected a mapping of sections at the top level, got {type(data).__name__}")
    try:
        data = apply_overrides(data or {}, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return validate_model(RunConfig, data, name)


def load_run_policy(cfg: RunConfig) -> Any:
    """Build the configured policy with its params (validates name and params before a run starts)."""
    from dynres.core.loading import policy_from_config

    return policy_from_config(cfg.async_training)


# ---- Engine builders (called inside the actors, or in-process with runtime: local) ------------


async def build_replica(
    *,
    replica_id: str,
    kind: str,
    engine: str,
    options: Mapping[str, Any],
    model_path: str | None,
    gpu_memory_utilization: float = 0.5,
    standalone_gpu_memory_utilization: float | None = None,
    seed: int = 0,
) -> Any:
    """Build one replica of ``engine`` ("fake" or "vllm") with its options (memory fractions 0-1)."""
    k = ReplicaKind(kind)
    if engine == "fake":
        from dynres.runtime.backends.fake import FakeReplica

        return FakeReplica(replica_id, k, **dict(options))
    if engine == "vllm":
        from dynres.runtime.backends.vllm import VllmReplica, VllmReplicaConfig

        if model_path is None:
            raise ConfigError("engines.rollout is 'vllm' but no model path was prepared; set model.path")
        opts = {"seed": seed, **dict(options)}
        cfg = VllmReplicaConfig.for_kind(
            k,
            model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            standalone_gpu_memory_utilization=standalone_gpu_memory_utilization,
            **opts,
        )
        return await VllmReplica.create(replica_id, cfg, k)
    raise ConfigError(f"engines.rollout={engine!r} is not a known engine; use 'vllm' or 'fake'")


def build_trainer(*, engine: str, options: Mapping[str, Any], model_path: str | None, seed: int = 0) -> Any:
    """Build the train engine of ``engine`` ("fake" or "torch") with its options."""
    if engine == "fake":
        from dynres.runtime.backends.fake import FakeTrainEngine

        return FakeTrainEngine(**dict(options))
    if engine == "torch":
        from dynres.runtime.backends.torch_engine import TorchTrainEngine

        if model_path is None:
            raise ConfigError("engines.trainer is 'torch' but no model path was prepared; set model.path")
        return TorchTrainEngine.from_pretrained(model_path, seed=seed, **dict(options))
    raise ConfigError(f"engines.trainer={engine!r} is not a known engine; use 'torch' or 'fake'")


def prompt_groups(cfg: RunConfig) -> Iterator[Any]:
    """Endless prompt groups of the toy task: ``task.num_prompts`` prompts, cycled, ids unique."""
    from dynres.runtime.realrun.tiny_task import make_prompts
    from dynres.runtime.samples import PromptGroup

    task = cfg.task
    prompts = make_prompts(
        task.num_prompts, length=task.prompt_length, vocab_size=cfg.tiny_spec().vocab_size, seed=cfg.run.seed
    )
    n = cfg.actor_rollout_ref.rollout.n
    for k in itertools.count():
        yield PromptGroup(
            sample_id=f"s{k}",
            prompt_token_ids=prompts[k % len(prompts)],
            n=n,
            max_tokens=task.max_tokens,
            temperature=task.temperature,
        )


class TrainTap:
    """Wraps a TrainEngine and keeps every fit step's metrics, to average them per cycle."""

    def __init__(self, inner: Any) -> None:
        """Wrap ``inner``; every other attribute is the inner engine's."""
        self._inner = inner
        self._pending: list[Mapping[str, float]] = []

    def __getattr__(self, name: str) -> Any:
        """Delegate everything else (offload, onload, export_weights, costs, shutdown)."""
        return getattr(self._inner, name)

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Run the inner fit step and remember its metrics."""
        result = await self._inner.train_step(batch)
        self._pending.append(dict(result.metrics))
        return result

    async def offload(self) -> None:
        """Inner offload (explicit so the wrapper satisfies the TrainEngine protocol)."""
        await self._inner.offload()

    async def onload(self) -> None:
        """Inner onload."""
        await self._inner.onload()

    async def export_weights(self) -> Any:
        """Inner weight export."""
        return await self._inner.export_weights()

    def costs(self) -> Any:
        """Inner cost estimates."""
        return self._inner.costs()

    async def shutdown(self) -> None:
        """Inner shutdown."""
        await self._inner.shutdown()

    def take_means(self) -> dict[str, float]:
        """Mean of each metric over the steps since the last call (then forget them)."""
        steps, self._pending = self._pending, []
        keys = {k for m in steps for k in m}
        return {
            f"{CYCLE_MEAN_PREFIX}{k}": sum(m[k] for m in steps if k in m) / sum(1 for m in steps if k in m)
            for k in sorted(keys)
        }


def build_spec(
    *,
    standalone: Sequence[Any],
    hybrid: Sequence[Any],
    train_engine: Any,
    progress: Callable[[Any], Any] | None,
    config: Mapping[str, Any],
) -> Any:
    """The RunSpec of a run file (``config`` is RunConfig data); runs where the loop will run."""
    from dynres.runtime.loop.run import RunSpec

    cfg = validate_model(RunConfig, config, "config")
    policy = load_run_policy(cfg)
    tap = TrainTap(train_engine)

    def on_cycle(cycle: Any) -> Any:
        cycle.train_metrics.update(tap.take_means())
        return progress(cycle) if progress is not None else None

    return RunSpec(
        config=cfg.dynres_config(),
        policy=policy,
        standalone=list(standalone),
        hybrid=list(hybrid),
        train_engine=tap,
        prompts=prompt_groups(cfg),
        num_cycles=cfg.run.steps,
        progress=on_cycle,
        op_timeout_s=cfg.run.op_timeout_s,
        policy_timeout_s=cfg.run.policy_timeout_s,
        sleep_level=cfg.run.sleep_level,
        seed=cfg.run.seed,
    )


# ---- Records ---------------------------------------------------------------------------------


def cycle_record(cycle: Any) -> dict[str, Any]:
    """The JSONL record of one cycle: its metrics, train metrics and counters (flat keys)."""
    rec: dict[str, Any] = {
        "step": cycle.step,
        "time_s": round(cycle.end_s, 6),
        "cycle_s": round(cycle.duration_s, 6),
        **cycle.metrics,
        **{k if "/" in k else f"train/{k}": v for k, v in cycle.train_metrics.items()},
        "hybrid_active_at_start": cycle.hybrid_active_at_start,
        "activated": cycle.activated,
        "deactivated": cycle.deactivated,
        "rebalanced": cycle.rebalanced,
        "deactivate_wait_samples": cycle.deactivate_wait_samples,
        "wait_for_enough_samples_s": cycle.wait_for_enough_samples_s,
        "samples_generated": cycle.samples_generated,
        "samples_consumed": cycle.samples_consumed,
        "samples_dropped_stale": cycle.samples_dropped_stale,
        "queue_size_end": cycle.queue_size_end,
        "weight_version": cycle.weight_version,
        "activate_s": cycle.activate_duration_s,
        "deactivate_s": cycle.deactivate_duration_s,
    }
    return rec


def reward_key(record: Mapping[str, Any]) -> str | None:
    """The key of the per-cycle mean reward in a JSONL record, if the trainer reports one."""
    for k in (f"{CYCLE_MEAN_PREFIX}reward/mean", f"{CYCLE_MEAN_PREFIX}reward", "reward/mean", "train/reward"):
        if k in record:
            return k
    return None


def operations_lines(report: Any) -> list[str]:
    """Human summary: dynres's own overhead next to each engine operation's time (seconds)."""
    ops = report.operations
    lines = [
        (
            f"controller overhead {ops.controller_overhead_s:.3f} s over {ops.activations} activations, "
            f"{ops.deactivations} deactivations, {ops.rebalances} rebalances; policy decisions "
            f"{ops.policy_wall_s * 1000:.1f} ms wall"
        ),
    ]
    for name in sorted(ops.engine):
        st = ops.engine[name]
        lines.append(
            f"  engine {name:<15} {st.count:>5} calls  total {st.total_s:8.3f} s  max {st.max_s:7.3f} s"
            + (f"  failures {st.failures}" if st.failures else "")
        )
    return lines


# ---- Running ---------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """What :func:`execute` returns."""

    report: Any
    """The RunReport (None when the run was interrupted before it finished)."""
    out_dir: Path
    """Where the files went."""
    backend: dict[str, Any] = field(default_factory=dict)
    """Backend facts (also in backend.json)."""
    interrupted: bool = False
    """True when Ctrl-C stopped the run."""


class _Sink:
    """Writes cycle records as they arrive and forwards them to the display."""

    def __init__(self, path: Path, on_cycle: Callable[[Any, dict[str, Any]], None] | None) -> None:
        self.path = path
        self.count = 0
        self._fh = path.open("w", encoding="utf-8")
        self._on_cycle = on_cycle

    def __call__(self, cycle: Any) -> None:
        rec = cycle_record(cycle)
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()  # an interrupted run keeps every finished cycle
        self.count += 1
        if self._on_cycle is not None:
            self._on_cycle(cycle, rec)

    def close(self) -> None:
        self._fh.close()


def prepare_model(cfg: RunConfig, out_dir: Path) -> str | None:
    """The model directory engines load: ``model.path``, or a tiny random Qwen2 saved under ``out_dir``."""
    if not cfg.needs_model:
        return None
    if cfg.model.path is not None:
        p = Path(cfg.model.path)
        if not (p / "config.json").is_file():
            raise ConfigError(f"model.path={cfg.model.path!r} has no config.json; give an HF-layout model directory")
        return str(p.resolve())
    from dynres.runtime.realrun.tiny_task import save_tiny_model

    return str(save_tiny_model(out_dir / "model", cfg.tiny_spec(), seed=cfg.run.seed, dtype=cfg.model.dtype).resolve())


def _factories(cfg: RunConfig, model_path: str | None) -> tuple[Any, Any, Any]:
    from dynres.runtime.backends.ray.factory import Factory

    eng = cfg.engines
    rollout = cfg.actor_rollout_ref.rollout
    common = {
        "engine": eng.rollout,
        "model_path": model_path,
        "seed": cfg.run.seed,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "standalone_gpu_memory_utilization": rollout.standalone_gpu_memory_utilization,
    }
    standalone = Factory("dynres.runtime.realrun:build_replica", {**common, "options": dict(eng.rollout_options)})
    hybrid = Factory(
        "dynres.runtime.realrun:build_replica",
        {**common, "options": {**eng.rollout_options, **eng.hybrid_options}},
    )
    trainer = Factory(
        "dynres.runtime.realrun:build_trainer",
        {"engine": eng.trainer, "options": dict(eng.trainer_options), "model_path": model_path, "seed": cfg.run.seed},
    )
    return standalone, hybrid, trainer


def _unwrap(exc: BaseException) -> BaseException:
    """The DynresError inside a Ray task error (so the CLI prints its one line), else ``exc``."""
    cause = getattr(exc, "cause", None)
    while cause is not None and not isinstance(exc, DynresError):
        exc, cause = cause, getattr(cause, "cause", None)
    return exc


async def _run_local(cfg: RunConfig, model_path: str | None, sink: _Sink, backend: dict[str, Any]) -> Any:
    from dynres.runtime.loop.run import run_fully_async

    s_f, h_f, t_f = _factories(cfg, model_path)
    dyn = cfg.dynres_config()
    t0 = time.perf_counter()
    standalone = [
        await s_f.build(replica_id=f"standalone-{i}", kind="standalone") for i in range(dyn.num_standalone_replicas)
    ]
    hybrid = [await h_f.build(replica_id=f"hybrid-{i}", kind="hybrid") for i in range(dyn.num_hybrid_replicas)]
    trainer = await t_f.build()
    backend["engines_start_s"] = time.perf_counter() - t0
    try:
        spec = build_spec(
            standalone=standalone, hybrid=hybrid, train_engine=trainer, progress=sink, config=cfg.model_dump()
        )
        return await run_fully_async(spec)
    finally:
        for engine in [*standalone, *hybrid, trainer]:
            try:
                await asyncio.wait_for(engine.shutdown(), cfg.cluster.shutdown_timeout_s)
            except Exception as exc:
                logger.warning("shutdown of %r failed: %s", engine, exc)


async def _run_ray(
    cfg: RunConfig,
    model_path: str | None,
    sink: _Sink,
    backend: dict[str, Any],
    on_status: Callable[[dict[str, Any]], None] | None,
    poll_s: float,
) -> Any:
    from dynres.runtime.backends.ray._ray import require_ray
    from dynres.runtime.backends.ray.cluster import RayCluster, driver_node_id
    from dynres.runtime.backends.ray.factory import Factory
    from dynres.runtime.realrun.on_ray import CoordinatorActor

    ray = require_ray()
    cluster = RayCluster(cfg.cluster)
    s_f, h_f, t_f = _factories(cfg, model_path)
    dyn = cfg.dynres_config()
    coordinator = None
    run_fut: asyncio.Future[Any] | None = None
    try:
        system = await cluster.start(dyn, standalone=s_f, hybrid=h_f, trainer=t_f)
        backend["engines_start_s"] = round(system.start_s, 3)
        backend["placement"] = {
            p.replica_id if hasattr(p, "replica_id") else "trainer": p.node_id
            for p in [*system.replicas, system.trainer]
        }
        backend["nodes"] = sorted({n["NodeID"] for n in ray.nodes() if n.get("Alive")})
        # The coordinator sits next to the driver: progress polls stay local, and losing a
        # rollout node never takes the run's brain with it.
        coordinator = cluster.spawn(
            CoordinatorActor, cfg.cluster.lag_interval_s, node_id=driver_node_id(), name="dynres-coordinator"
        )
        build = Factory("dynres.runtime.realrun:build_spec", {"config": cfg.model_dump()})
        # Engine start-up (imports, model loading) is not the run: measure the loops from here.
        await asyncio.gather(*(p.loop_lag(reset=True) for p in [*system.replicas, system.trainer]))
        run_fut = asyncio.ensure_future(
            _await(coordinator.run.remote(build, system.standalone, system.hybrid, system.trainer))
        )
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
                    report = done.pop().result()
                except Exception as exc:
                    raise _unwrap(exc) from None
                break
        backend["loop_lag"] = await _loop_lags(coordinator, system)
        return report
    except asyncio.CancelledError:
        # Ctrl-C: the coordinator's teardown aborts in-flight requests and deactivates hybrids.
        if coordinator is not None:
            try:
                backend["stop"] = await asyncio.wait_for(
                    coordinator.stop.remote(cfg.cluster.shutdown_timeout_s), cfg.cluster.shutdown_timeout_s + 5
                )
                for cycle in await coordinator.events.remote(sink.count):
                    sink(cycle)
            except Exception as exc:
                backend["stop"] = {"stopped": False, "error": f"{type(exc).__name__}: {exc}"}
                logger.warning("coordinator did not stop cleanly: %s", exc)
        if run_fut is not None:
            # The remote run ends with TaskCancelledError now; collect it so nothing is logged.
            run_fut.cancel()
            await asyncio.gather(run_fut, return_exceptions=True)
        raise
    finally:
        backend["lost"] = {p.replica_id: p.lost_reason for p in cluster.system.replicas if p.lost_reason is not None}
        backend["shutdown_problems"] = await cluster.shutdown()


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


def execute(
    cfg: RunConfig,
    out_dir: str | Path,
    *,
    on_cycle: Callable[[Any, dict[str, Any]], None] | None = None,
    on_status: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 0.5,
    plots: bool = True,
) -> RunOutcome:
    """Run ``cfg`` to the end (or Ctrl-C); write metrics.jsonl, report.json, backend.json, plots.

    Raises KeyboardInterrupt after a clean teardown when interrupted; DynresError on a bad
    config or a failing backend.
    """
    load_run_policy(cfg)  # a bad policy name or params fails here, before anything starts
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_path = prepare_model(cfg, out)
    backend: dict[str, Any] = {
        "runtime": cfg.engines.runtime,
        "rollout": cfg.engines.rollout,
        "trainer": cfg.engines.trainer,
        "model_path": model_path,
    }
    sink = _Sink(out / METRICS_FILE, on_cycle)
    cluster_conn = None
    outcome = RunOutcome(None, out, backend)
    t0 = time.perf_counter()
    try:
        if cfg.engines.runtime == "local":
            report = asyncio.run(_run_local(cfg, model_path, sink, backend))
        else:
            from dynres.runtime.backends.ray.cluster import RayCluster

            cluster_conn = RayCluster(cfg.cluster)
            cluster_conn.connect()  # blocking by nature: done before the event loop starts
            report = asyncio.run(_run_ray(cfg, model_path, sink, backend, on_status, poll_s))
        outcome.report = report
    except KeyboardInterrupt:
        outcome.interrupted = True
        raise
    finally:
        backend["wall_s"] = round(time.perf_counter() - t0, 3)
        backend["interrupted"] = outcome.interrupted
        sink.close()
        if cluster_conn is not None:
            cluster_conn.disconnect()
        (out / BACKEND_FILE).write_text(json.dumps(backend, indent=2, default=str))
    (out / REPORT_FILE).write_text(outcome.report.to_json(indent=2))
    if plots:
        from dynres.runtime.plots import write_plots

        write_plots(outcome.report, out / "plots", title=f"dynres run ({outcome.report.policy})")
    return outcome


__all__ = [
    "BACKEND_FILE",
    "METRICS_FILE",
    "REPORT_FILE",
    "EnginesSection",
    "ModelSection",
    "RunConfig",
    "RunOutcome",
    "RunSection",
    "TaskSection",
    "build_replica",
    "build_spec",
    "build_trainer",
    "cycle_record",
    "execute",
    "load_run_config",
    "load_run_policy",
    "operations_lines",
    "prompt_groups",
]
