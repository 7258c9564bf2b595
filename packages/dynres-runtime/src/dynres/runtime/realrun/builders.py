"""Engines of a ``dynres run``: replica and trainer builders, their factories, the model and the prompts.

:func:`build_replica`, :func:`build_trainer` and :func:`build_spec` are the factory targets
(``"dynres.runtime.realrun.builders:build_replica"``, ...): Ray actors call them where the engine
or the loop will live, and ``runtime: local`` calls them in this process.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynres.core.config import validate_model
from dynres.core.errors import ConfigError
from dynres.runtime.hosts import host_facts
from dynres.runtime.protocols import CheckpointableTrainEngine, ReplicaKind, TrainStepResult
from dynres.runtime.realrun.config import RunConfig, load_run_policy

CYCLE_MEAN_PREFIX = "cycle_mean/"
"""Prefix of train metrics averaged over all fit steps of a cycle (the report keeps the last)."""


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


def prompt_groups(cfg: RunConfig, start: int = 0) -> Iterator[Any]:
    """Endless prompt groups of the toy task: ``task.num_prompts`` prompts, cycled, ids unique
    (``s<k>`` for the k-th group, prompt ``p<i>``); ``start``: begin at group ``start`` (a resumed
    run's position). With ``task.length_median`` each prompt has its own response limit."""
    from dynres.runtime.realrun.tiny_task import make_prompts, prompt_token_limits
    from dynres.runtime.samples import PromptGroup

    task = cfg.task
    prompts = make_prompts(
        task.num_prompts, length=task.prompt_length, vocab_size=cfg.tiny_spec().vocab_size, seed=cfg.run.seed
    )
    if task.length_median is None:
        limits = [task.max_tokens] * len(prompts)
    else:
        limits = prompt_token_limits(
            len(prompts), median=task.length_median, sigma=task.length_sigma, cap=task.max_tokens, seed=cfg.run.seed
        )
    n = cfg.actor_rollout_ref.rollout.n
    for k in itertools.count(start):
        i = k % len(prompts)
        yield PromptGroup(
            sample_id=f"s{k}",
            prompt_token_ids=prompts[i],
            n=n,
            max_tokens=limits[i],
            temperature=task.temperature,
            prompt_id=f"p{i}",
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
        """Offload the inner engine (spelled out so the wrapper satisfies the TrainEngine protocol)."""
        await self._inner.offload()

    async def onload(self) -> None:
        """Onload the inner engine."""
        await self._inner.onload()

    async def export_weights(self) -> Any:
        """The inner engine's weight update (its metrics are not touched)."""
        return await self._inner.export_weights()

    def costs(self) -> Any:
        """The inner engine's operation cost estimates (seconds)."""
        return self._inner.costs()

    async def shutdown(self) -> None:
        """Shut the inner engine down."""
        await self._inner.shutdown()

    @property
    def can_save_state(self) -> bool:
        """True when the inner engine saves and loads its state (a run checkpoint holds it then)."""
        return isinstance(self._inner, CheckpointableTrainEngine) and getattr(self._inner, "can_save_state", True)

    async def save_state(self, path: str) -> None:
        """Save the inner engine's state into folder ``path``."""
        await self._inner.save_state(path)

    async def load_state(self, path: str) -> None:
        """Load the inner engine's state from folder ``path``."""
        await self._inner.load_state(path)

    def peek_means(self) -> dict[str, float]:
        """Mean of each metric over the steps since the last :meth:`take_means` (kept)."""
        steps = self._pending
        keys = {k for m in steps for k in m}
        return {
            f"{CYCLE_MEAN_PREFIX}{k}": sum(m[k] for m in steps if k in m) / sum(1 for m in steps if k in m)
            for k in sorted(keys)
        }

    def take_means(self) -> dict[str, float]:
        """Mean of each metric over the steps since the last call (then forget them)."""
        means = self.peek_means()
        self._pending = []
        return means


def build_spec(
    *,
    standalone: Sequence[Any],
    hybrid: Sequence[Any],
    train_engine: Any,
    progress: Callable[[Any], Any] | None,
    config: Mapping[str, Any],
    out_dir: str | None = None,
    resume: Mapping[str, Any] | None = None,
    restart: str | Callable[..., Any] | None = None,
) -> Any:
    """The RunSpec of a run file (``config`` is RunConfig data); runs where the loop will run.

    With ``out_dir`` the run keeps ``ledger.jsonl`` and ``checkpoints/`` there (every
    ``run.checkpoint_every`` cycles); ``resume`` is a checkpoint loaded from that folder (the run
    goes on from it to ``run.steps``); ``restart`` recreates a gone replica (a ReplicaRestarter,
    or its ``"module:function"`` path).
    """
    from dynres.runtime.backends.ray.factory import resolve_target
    from dynres.runtime.loop.checkpoint import CHECKPOINTS_DIR, CheckpointStore
    from dynres.runtime.loop.driver import RunSpec
    from dynres.runtime.loop.ledger import LEDGER_FILE, LedgerWriter

    cfg = validate_model(RunConfig, config, "config")
    policy = load_run_policy(cfg)
    tap = TrainTap(train_engine)
    done = int(resume["global_steps"]) if resume else 0
    store = ledger = None
    if out_dir is not None:
        store = CheckpointStore(Path(out_dir) / CHECKPOINTS_DIR)
        ledger = LedgerWriter(
            Path(out_dir) / LEDGER_FILE,
            segment=int(resume.get("segment", 0)) + 1 if resume else 0,
            keep_lines=int(resume.get("ledger_lines", 0)) if resume else None,
        )

    def on_cycle(cycle: Any) -> Any:
        cycle.train_metrics.update(tap.take_means())
        return progress(cycle) if progress is not None else None

    return RunSpec(
        config=cfg.dynres_config(),
        policy=policy,
        standalone=list(standalone),
        hybrid=list(hybrid),
        train_engine=tap,
        prompts=prompt_groups(cfg, start=int(resume["prompts"]["position"]) if resume else 0),
        num_cycles=cfg.run.steps - done,
        progress=on_cycle,
        record_metrics=tap.peek_means,
        op_timeout_s=cfg.run.op_timeout_s,
        policy_timeout_s=cfg.run.policy_timeout_s,
        sleep_level=cfg.run.sleep_level,
        seed=cfg.run.seed,
        shared_host=host_facts(cfg.model_dump(mode="json"))[0] is True,
        calibration_switches=cfg.run.calibration_switches,
        resume_from=resume,
        checkpoints=store,
        checkpoint_every=cfg.run.checkpoint_every if store is not None else 0,
        ledger=ledger,
        restart_replica=resolve_target(restart) if restart is not None else None,
        max_restarts=cfg.engines.max_restarts,
    )


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


def engine_factories(cfg: RunConfig, model_path: str | None) -> tuple[Any, Any, Any]:
    """Factories of (standalone replica, hybrid replica, trainer): built in actors or in this process."""
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
    here = __name__  # the factories name functions of this module, importable in every actor
    standalone = Factory(f"{here}:build_replica", {**common, "options": dict(eng.rollout_options)})
    hybrid = Factory(f"{here}:build_replica", {**common, "options": {**eng.rollout_options, **eng.hybrid_options}})
    trainer = Factory(
        f"{here}:build_trainer",
        {"engine": eng.trainer, "options": dict(eng.trainer_options), "model_path": model_path, "seed": cfg.run.seed},
    )
    return standalone, hybrid, trainer
