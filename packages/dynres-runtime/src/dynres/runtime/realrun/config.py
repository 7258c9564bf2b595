"""The ``dynres run`` file: :class:`RunConfig` and its sections, loaded and validated.

The file is a :class:`~dynres.core.config.DynresConfig` (verl's ``async_training``,
``actor_rollout_ref``, ``rollout`` and ``trainer`` sections, unchanged) plus five sections of
its own::

    run:      {steps: 12, seed: 0}                       # sync cycles to train
    ray:      {address: null, slot: {CPU: 0.25}}         # Ray: local or an existing cluster
    engines:  {runtime: ray, rollout: vllm, trainer: torch, rollout_options: {...}}
    model:    {path: null, tiny: {hidden_size: 64}}      # null path: a random tiny Qwen2
    task:     {num_prompts: 64, prompt_length: 8, max_tokens: 16}

Every section is strict (``extra="forbid"``): a typo is one error line naming the key and the
nearest valid one. Renamed keys (``cluster:`` -> ``ray:``, ``run.startup_probe`` ->
``run.calibration_switches``) are still read, with one warning line
(:data:`~dynres.runtime.renamed_keys.RENAMED_RUN_KEYS`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from dynres.core.config import (
    DynresConfig,
    StrictModel,
    apply_overrides,
    drop_verl_only_keys,
    ignored_verl_keys_line,
    read_yaml,
    validate_model,
)
from dynres.core.errors import ConfigError, did_you_mean
from dynres.runtime.backends.ray.cluster import RayClusterConfig
from dynres.runtime.renamed_keys import RENAMED_RUN_KEYS, upgrade_keys, upgrade_override_keys


class RunSection(StrictModel):
    """The ``run`` section: how long to train and the run-level knobs."""

    steps: int = Field(..., ge=1, le=1_000_000, description="Sync cycles (weight syncs) to train (count).")
    seed: int = Field(0, description="Seed of prompts, the tiny model, engines and routing.")
    op_timeout_s: float = Field(600.0, gt=0, description="Longest one engine operation may take (seconds).")
    policy_timeout_s: float = Field(10.0, gt=0, description="Longest one policy decision may take (seconds).")
    sleep_level: int = Field(1, ge=1, le=2, description="Replica.sleep level on deactivation (1 keeps weights in CPU).")
    calibration_switches: int = Field(
        1,
        ge=0,
        le=10,
        description="Switch round trips (trainer offload, hybrid wake-up, weight load, sleep, onload) measured "
        "before the first cycle, so `dynres scenario fit` knows the switch costs of a run that never switches "
        "(count; 0 = none; needs hybrid replicas; a hybrid replica that starts awake is put to sleep either way). "
        "Costs one idle switch per round, once per run. Formerly `startup_probe`, still read with a warning.",
    )
    checkpoint_every: int = Field(
        10,
        ge=0,
        le=1_000_000,
        description="Write a checkpoint into <out>/checkpoints every this many cycles and after the last one "
        "(count; 0 = never): the trainer's weights and optimizer state, the queue and partial samples, the "
        "policy state and the prompt source's position; `dynres run CONFIG --resume DIR` continues from the "
        "latest one. The newest two are kept.",
    )


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
    max_restarts: int = Field(
        3,
        ge=0,
        le=1000,
        description="Times a replica whose actor, process or node is gone is recreated over the run, each after "
        "a backoff (1 s, doubling up to 60 s); then it is quarantined (count; 0 = never recreate).",
    )


def _tiny_spec_model() -> type[StrictModel]:
    """A strict pydantic model of TinyModelSpec's fields (so `model.tiny` typos are caught)."""
    from dynres.runtime.realrun.tiny_task import TinyModelSpec

    hints = typing.get_type_hints(TinyModelSpec)
    fields = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(TinyModelSpec)}
    model = create_model("TinyModelSection", __base__=StrictModel, **fields)  # type: ignore[call-overload]  # fields from a dict
    return model


if TYPE_CHECKING:
    # Fields made at run time are invisible to mypy; to it the section is a plain StrictModel.
    TinyModelSection = StrictModel
else:
    TinyModelSection = _tiny_spec_model()
    """The ``model.tiny`` section: TinyModelSpec's fields (vocab_size, hidden_size, ...), strict."""


class ModelSection(StrictModel):
    """The ``model`` section: a checkpoint directory, or a random tiny Qwen2 built at run time."""

    path: str | None = Field(
        None, description="HF-layout model directory visible on every node; null builds a tiny random Qwen2."
    )
    tiny: TinyModelSection = Field(
        default_factory=TinyModelSection, description="Shape of the random model (TinyModelSpec fields)."
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of the tiny model.")


class TaskSection(StrictModel):
    """The ``task`` section: the toy verifiable task (rule token + parity reward)."""

    num_prompts: int = Field(64, ge=1, description="Distinct prompts, cycled over (count).")
    prompt_length: int = Field(8, ge=2, description="Tokens per prompt, rule token included (count).")
    max_tokens: int = Field(16, ge=1, description="Tokens per response at most (count).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    length_median: int | None = Field(
        None,
        ge=1,
        description="Long-tail task: each prompt gets its own response limit, lognormal around this median "
        "and capped at max_tokens, the same in every epoch (tokens; null: every response may run to max_tokens).",
    )
    length_sigma: float = Field(
        1.0, ge=0.0, le=3.0, description="Spread of the long-tail task's per-prompt limits: std of log(length) (nats)."
    )

    @model_validator(mode="after")
    def _median_within_limit(self) -> TaskSection:
        if self.length_median is not None and self.length_median > self.max_tokens:
            raise ValueError(
                f"task.length_median={self.length_median} exceeds task.max_tokens={self.max_tokens}, which caps "
                "every response; lower length_median or raise max_tokens"
            )
        return self


class RunConfig(DynresConfig):
    """A ``dynres run`` file: the DynresConfig sections plus run, ray, engines, model, task."""

    run: RunSection = Field(..., description="How long to train.")
    ray: RayClusterConfig = Field(
        default_factory=RayClusterConfig,
        description="Where Ray runs. Formerly `cluster`, still read with a warning (`cluster` in a scenario "
        "holds GPU counts).",
    )
    engines: EnginesSection = Field(default_factory=EnginesSection, description="Which engines, where.")
    model: ModelSection = Field(default_factory=ModelSection, description="The model.")
    task: TaskSection = Field(default_factory=TaskSection, description="The toy task.")

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        # extra="forbid" rejects the old names, so they move to the new ones before validation.
        # load_run_config has moved them already (with the file's name in the warning).
        return upgrade_keys(data, RENAMED_RUN_KEYS, "run config")

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

    @model_validator(mode="after")
    def _fake_options(self) -> RunConfig:
        # Fake engines are built from these options only once the run starts; build one of each
        # here so a bad option is one line before anything starts.
        from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine

        eng = self.engines
        checks: list[tuple[str, Any, dict[str, Any]]] = []
        if eng.rollout == "fake":
            checks.append(("engines.rollout_options", FakeReplica, dict(eng.rollout_options)))
            checks.append(("engines.hybrid_options", FakeReplica, {**eng.rollout_options, **eng.hybrid_options}))
        if eng.trainer == "fake":
            checks.append(("engines.trainer_options", FakeTrainEngine, dict(eng.trainer_options)))
        for where, cls, opts in checks:
            _check_option_names(where, cls, opts)
            try:
                if cls is FakeReplica:
                    cls("check", **opts)
                else:
                    cls(**opts)
            except TypeError as exc:
                raise ValueError(f"{where}: {exc}; see the {cls.__name__} arguments") from None
            except ConfigError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return self

    def required_extras(self) -> list[tuple[str, str]]:
        """``(module, extra)`` pairs the configured engines import, the engine's own extra first:
        vLLM replicas need ``[vllm]`` (vllm, then torch), the torch trainer ``[torch]``, Ray ``[ray]``."""
        needs: list[tuple[str, str]] = []
        if self.engines.runtime == "ray":
            needs.append(("ray", "ray"))
        if self.engines.rollout == "vllm":
            needs += [("vllm", "vllm"), ("torch", "vllm"), ("transformers", "vllm")]
        if self.engines.trainer == "torch":
            needs += [("torch", "torch"), ("transformers", "torch"), ("safetensors", "torch")]
        return needs

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


def _check_option_names(where: str, cls: type, opts: dict[str, Any]) -> None:
    """Raise ValueError naming an option ``cls`` does not take, the nearest one and the valid ones."""
    import inspect

    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if n != "replica_id" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for name in opts:
        if name not in valid:
            hint = did_you_mean(name, valid)
            raise ValueError(
                f"{where}: unknown option {name!r}{hint}; the {cls.__name__} options are {', '.join(valid)} "
                "(docs/real-runs.md)"
            )


def load_run_config(
    source: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    *,
    strict: bool = True,
    on_ignored: Callable[[str], Any] | None = None,
) -> RunConfig:
    """Load and validate a run file (or mapping); ``overrides`` are dotted keys, e.g. {"run.steps": 2}.

    ``strict=False`` accepts a complete verl config around the run sections: verl's keys dynres
    does not model are dropped and named in one line passed to ``on_ignored``.
    """
    data = source if isinstance(source, Mapping) else read_yaml(source)
    name = "config" if isinstance(source, Mapping) else str(source)
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError(f"{name}: expected a mapping of sections at the top level, got {type(data).__name__}")
    data = upgrade_keys(data or {}, RENAMED_RUN_KEYS, name)
    try:
        overrides = upgrade_override_keys(overrides or {}, RENAMED_RUN_KEYS, "--set")
        data = apply_overrides(data, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if not strict:
        data, removed = drop_verl_only_keys(data, RunConfig)
        if removed and on_ignored is not None:
            on_ignored(ignored_verl_keys_line(removed, name))
    return validate_model(RunConfig, data, name)


def load_run_policy(cfg: RunConfig) -> Any:
    """Build the configured policy with its params (validates name and params before a run starts)."""
    from dynres.core.loading import policy_from_config

    return policy_from_config(cfg.async_training)
