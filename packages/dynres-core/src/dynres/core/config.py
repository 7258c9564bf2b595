"""Configuration models: verl-compatible keys, validated with pydantic v2 and ``extra="forbid"``.

The layout follows verl's training config so that its keys can be copied unchanged::

    async_training:            # AsyncTrainingConfig
      use_dynamic_resource_scheduling: true
      dynamic_schedule_policy: default
      ...
    actor_rollout_ref:
      actor: {ppo_mini_batch_size: 32}
      rollout: {gpu_memory_utilization: 0.45, standalone_gpu_memory_utilization: 0.7, n: 16}
    rollout: {nnodes: 2, n_gpus_per_node: 8}      # standalone rollout nodes
    trainer: {nnodes: 2, n_gpus_per_node: 8,      # trainer nodes (hybrid replicas live here)
              logger: [console, tensorboard]}     # tracking backends (dynres.core.tracking)
"""

from __future__ import annotations

import copy
import datetime
import functools
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dynres.core.errors import ConfigError, did_you_mean

M = TypeVar("M", bound=BaseModel)


MAX_COUNT = 10_000
"""Upper bound of per-cycle counts (sync steps, responses per prompt, samples per replica): a
larger value is a typo, and would make a run allocate without end before failing."""
MAX_SAMPLES = 1_000_000
"""Upper bound of ppo_mini_batch_size (samples)."""
MAX_NODES = 100_000
"""Upper bound of nnodes (count)."""
MAX_GPUS_PER_NODE = 1024
"""Upper bound of n_gpus_per_node and tensor_model_parallel_size (count)."""
MAX_STALENESS = 1000.0
"""Upper bound of staleness_threshold (cycles of extra production)."""


def _dates_as_text(v: Any) -> Any:
    """YAML reads ``2024-01-01`` as a ``datetime.date``, which no config field takes and JSON
    output cannot hold: give it back as the text it was written as."""
    if isinstance(v, dict):
        return {k: _dates_as_text(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_dates_as_text(x) for x in v]
    if isinstance(v, datetime.date):  # datetime.datetime is a date too
        return v.isoformat()
    return v


class StrictModel(BaseModel):
    """Base of every config model: unknown keys are errors, values are validated on assignment."""

    # inf would pass every lower bound and later overflow int() in buffer sizes; nan fails late.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class AsyncTrainingConfig(StrictModel):
    """The ``async_training`` section: verl's fully-async and dynamic-scheduling keys."""

    use_dynamic_resource_scheduling: bool = Field(
        False, description="Master switch: run hybrid replicas on the trainer's GPUs."
    )
    dynamic_schedule_policy: str = Field(
        "default", min_length=1, description="Policy name (entry point) or 'module:Class' path."
    )
    dynamic_schedule_deactivate_ratio: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Starting deactivate_ratio of the built-in policies (fraction of a cycle's samples).",
    )
    dynamic_schedule_enable_rebalance: bool = Field(
        True, description="Allow a rebalance after activation when the policy asks for one."
    )
    dynamic_schedule_policy_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra params for the policy's Params model (dynres addition; validated on load).",
    )
    staleness_threshold: float = Field(
        0.1,
        ge=0.0,
        le=MAX_STALENESS,
        description="Extra production allowed per cycle as a fraction of a cycle's samples.",
    )
    trigger_parameter_sync_step: int = Field(
        4, ge=1, le=MAX_COUNT, description="Collections (fit steps) per weight sync."
    )
    require_batches: int = Field(1, ge=1, le=MAX_COUNT, description="PPO mini-batches per collection.")
    partial_rollout: bool = Field(
        True, description="Resume aborted generations from their partial output instead of restarting."
    )
    concurrent_samples_per_replica: int = Field(
        16, ge=1, le=MAX_COUNT, description="Samples one replica generates at once (count, dynres default)."
    )


class ActorConfig(StrictModel):
    """The ``actor_rollout_ref.actor`` keys dynres reads."""

    ppo_mini_batch_size: int = Field(32, ge=1, le=MAX_SAMPLES, description="Samples (prompt groups) per mini-batch.")


class RolloutEngineConfig(StrictModel):
    """The ``actor_rollout_ref.rollout`` keys dynres reads."""

    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="GPU memory fraction of a hybrid replica (shares the trainer's GPU)."
    )
    standalone_gpu_memory_utilization: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="GPU memory fraction of a standalone replica; null falls back to gpu_memory_utilization.",
    )
    tensor_model_parallel_size: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE, description="GPUs per inference replica.")
    n: int = Field(1, ge=1, le=MAX_COUNT, description="Responses generated per prompt (one sample = n responses).")

    @property
    def effective_standalone_gpu_memory_utilization(self) -> float:
        """Memory fraction standalone replicas actually use (the fallback applied)."""
        if self.standalone_gpu_memory_utilization is None:
            return self.gpu_memory_utilization
        return self.standalone_gpu_memory_utilization


class ActorRolloutRefConfig(StrictModel):
    """The ``actor_rollout_ref`` section."""

    actor: ActorConfig = Field(default_factory=ActorConfig, description="Trainer-side actor keys.")
    rollout: RolloutEngineConfig = Field(default_factory=RolloutEngineConfig, description="Inference engine keys.")


class NodesConfig(StrictModel):
    """A pool of nodes: ``rollout`` (standalone replicas) or ``trainer`` (training + hybrid replicas)."""

    nnodes: int = Field(1, ge=0, le=MAX_NODES, description="Nodes in the pool (count; rollout.nnodes 0 = only hybrid).")
    n_gpus_per_node: int = Field(8, ge=1, le=MAX_GPUS_PER_NODE, description="GPUs per node (count).")

    @property
    def n_gpus(self) -> int:
        """GPUs in the pool (count)."""
        return self.nnodes * self.n_gpus_per_node


TRACKING_BACKENDS_HINT = "console, file, tensorboard, mlflow, wandb"
"""The tracking backends dynres-runtime ships (a plugin may add more; ``dynres config schema`` lists them)."""


class TrackingConfig(StrictModel):
    """verl's tracking keys of the ``trainer`` section: where a run's per-cycle metrics are logged."""

    logger: list[str] = Field(
        default_factory=lambda: ["console"],
        json_schema_extra={"default": ["console"]},
        description="Tracking backends that receive every sync cycle's metrics, as in verl's trainer.logger: "
        f"{TRACKING_BACKENDS_HINT}, or one a `dynres.plugins` package adds (a single name is read as a list).",
    )
    project_name: str = Field(
        "dynres", min_length=1, description="Project of the tracked runs (MLflow experiment, W&B project)."
    )
    experiment_name: str | None = Field(
        None,
        min_length=1,
        description="Name of the tracked run; null: the output folder's name (dynres run) or each run's "
        "scenario[policy] label (dynres simulate).",
    )

    @field_validator("logger", mode="before")
    @classmethod
    def _one_name(cls, v: Any) -> Any:
        # verl accepts `logger: console` as well as a list.
        return [v] if isinstance(v, str) else v

    @field_validator("logger")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        names = [n.strip() for n in v]
        if any(not n for n in names):
            raise ValueError("trainer.logger: a backend name is empty; list names such as [console, tensorboard]")
        return list(dict.fromkeys(names))  # a name given twice logs once


class TrainerConfig(TrackingConfig, NodesConfig):
    """verl's ``trainer`` section: the trainer's nodes (hybrid replicas live there) and the tracking keys."""


class DynresConfig(StrictModel):
    """A whole dynres configuration: async training, engine and the two node pools."""

    async_training: AsyncTrainingConfig = Field(
        default_factory=AsyncTrainingConfig, description="verl's async_training section."
    )
    actor_rollout_ref: ActorRolloutRefConfig = Field(
        default_factory=ActorRolloutRefConfig, description="verl's actor_rollout_ref section."
    )
    rollout: NodesConfig = Field(
        default_factory=NodesConfig, description="Standalone rollout nodes (verl's rollout section)."
    )
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig,
        description="Trainer nodes (hybrid replicas share their GPUs) and verl's tracking keys (trainer.logger).",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> DynresConfig:
        tp = self.actor_rollout_ref.rollout.tensor_model_parallel_size
        if self.trainer.nnodes < 1:
            raise ValueError("trainer.nnodes must be >= 1: training needs GPUs")
        if self.only_hybrid and not self.async_training.use_dynamic_resource_scheduling:
            raise ValueError(
                "rollout.nnodes is 0 (only hybrid replicas) but "
                "async_training.use_dynamic_resource_scheduling is false, so nothing would "
                "generate; set it to true or give rollout.nnodes >= 1"
            )
        if self.rollout.n_gpus and self.rollout.n_gpus % tp:
            raise ValueError(
                f"rollout has {self.rollout.n_gpus} GPUs, not a multiple of "
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"
            )
        if self.async_training.use_dynamic_resource_scheduling and self.trainer.n_gpus % tp:
            raise ValueError(
                f"trainer has {self.trainer.n_gpus} GPUs, not a multiple of "
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} (hybrid replicas "
                "are cut from the trainer's GPUs)"
            )
        return self

    @property
    def only_hybrid(self) -> bool:
        """True when there are no standalone rollout nodes (rollout.nnodes == 0)."""
        return self.rollout.nnodes == 0

    @property
    def required_samples(self) -> int:
        """Samples per collection: ppo_mini_batch_size x require_batches (count)."""
        return self.actor_rollout_ref.actor.ppo_mini_batch_size * self.async_training.require_batches

    @property
    def num_standalone_replicas(self) -> int:
        """Standalone replicas: rollout GPUs / GPUs per replica (count)."""
        return self.rollout.n_gpus // self.actor_rollout_ref.rollout.tensor_model_parallel_size

    @property
    def num_hybrid_replicas(self) -> int:
        """Hybrid replicas on the trainer's GPUs, 0 when dynamic scheduling is off (count)."""
        if not self.async_training.use_dynamic_resource_scheduling:
            return 0
        return self.trainer.n_gpus // self.actor_rollout_ref.rollout.tensor_model_parallel_size


def format_validation_error(exc: ValidationError, model: type[BaseModel], source: str = "") -> str:
    """Turn a pydantic error into one line naming each bad key, with a did-you-mean for typos."""
    where = f"{source}: " if source else ""
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(root)"
        if err["type"] == "extra_forbidden":
            siblings = _field_names_at(model, loc[:-1])
            hint = did_you_mean(loc[-1], siblings)
            alone = len(exc.errors()) == 1  # with several problems, the lists of valid keys would drown them
            valid = f"; valid keys here: {', '.join(siblings)}" if siblings and not hint and alone else ""
            parts.append(f"unknown key {key!r}{hint}{valid}")
        elif err["type"] == "missing":
            parts.append(f"missing key {key!r}")
        elif not loc:
            parts.append(err["msg"].removeprefix("Value error, "))
        else:
            parts.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
    if len(parts) > MAX_PROBLEMS_SHOWN:
        # A complete verl config under --strict has dozens; one readable line names the first few.
        unknown = sum(1 for e in exc.errors() if e["type"] == "extra_forbidden")
        rest = len(parts) - MAX_PROBLEMS_SHOWN
        why = " (keys of verl's config that dynres does not model are ignored without --strict)" if unknown > 1 else ""
        parts = [*parts[:MAX_PROBLEMS_SHOWN], f"and {rest} more problem(s){why}"]
    return where + "; ".join(parts)


MAX_PROBLEMS_SHOWN = 3
"""Problems one validation error line names before it counts the rest."""


def _field_names_at(model: type[BaseModel], path: list[str]) -> list[str]:
    current: Any = model
    for part in path:
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def validate_model(model: type[M], data: Any, source: str = "") -> M:
    """Validate ``data`` against ``model``; raise ConfigError with one line naming every bad key."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source or 'config'}: expected a mapping of keys at the top level, got {type(data).__name__}"
        )
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, source)) from None


@functools.cache
def verl_keys() -> tuple[frozenset[str], frozenset[str]]:
    """verl's config keys as dotted paths, and those under which verl accepts any key (``.*`` lines).

    Read from ``verl_keys.txt`` (the keys of verl's composed fully-async trainer configs, written
    by ``scripts/dev/gen-verl-keys.py``).
    """
    text = resources.files("dynres.core").joinpath("verl_keys.txt").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    return frozenset(ln for ln in lines if not ln.endswith(".*")), frozenset(
        ln[:-2] for ln in lines if ln.endswith(".*")
    )


def is_verl_key(dotted: str) -> bool:
    """True when ``dotted`` (e.g. ``trainer.total_epochs``) is a key of verl's fully-async trainer config."""
    keys, open_prefixes = verl_keys()
    if dotted in keys:
        return True
    parts = dotted.split(".")
    return any(".".join(parts[:i]) in open_prefixes for i in range(1, len(parts)))


def drop_verl_only_keys(data: Any, model: type[BaseModel]) -> tuple[Any, list[str]]:
    """Remove the keys of verl's config that ``model`` does not model; return ``(rest, removed)``.

    ``removed`` holds dotted keys, a whole removed section once (``data``, not each key in it).
    Keys that are neither modelled nor verl's stay, so validation still rejects a typo and names
    the nearest valid key. Lets a complete verl config be read by dynres without ``--strict``.
    """
    removed: list[str] = []

    def walk(node: Any, current: Any, prefix: str) -> Any:
        fields = getattr(current, "model_fields", None)
        if not isinstance(node, Mapping) or not fields:
            return node
        kept: dict[str, Any] = {}
        for key, value in node.items():
            path = f"{prefix}{key}"
            if key in fields:
                kept[key] = walk(value, fields[key].annotation, path + ".")
            elif isinstance(key, str) and is_verl_key(path):
                removed.append(path)
            else:
                kept[key] = value
        return kept

    return walk(data, model, ""), removed


def ignored_verl_keys_line(removed: Sequence[str], source: str = "") -> str:
    """The one informational line naming the verl keys dynres ignored ('' when none were)."""
    if not removed:
        return ""
    where = f"{source}: " if source else ""
    return f"{where}ignored {len(removed)} verl key(s) dynres does not model (--strict rejects them): " + ", ".join(
        removed
    )


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file; raise ConfigError naming the file when it is missing, unreadable, not
    UTF-8 text, malformed or empty (nothing but whitespace and comments)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: file not found; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory; give a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{p}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); give a YAML file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        data = _dates_as_text(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}: invalid YAML{at}: {problem}") from None
    if data is None:
        raise ConfigError(f"{p}: the file is empty (or only comments); give a mapping of sections, as in examples/")
    return data


def load_config(source: str | Path | Mapping[str, Any]) -> DynresConfig:
    """Load a DynresConfig from a YAML path or a mapping; raise ConfigError on any bad key."""
    if isinstance(source, Mapping):
        return validate_model(DynresConfig, source, "config")
    return validate_model(DynresConfig, read_yaml(source), str(source))


def policy_params_from_config(cfg: AsyncTrainingConfig, params_model: type[BaseModel]) -> dict[str, Any]:
    """Params for a policy from config: ``dynamic_schedule_policy_params`` plus the starting ratio.

    ``dynamic_schedule_deactivate_ratio`` fills a ``deactivate_ratio`` field when the policy
    has one and the params do not set it explicitly.
    """
    params = dict(cfg.dynamic_schedule_policy_params)
    if "deactivate_ratio" in params_model.model_fields and "deactivate_ratio" not in params:
        params["deactivate_ratio"] = cfg.dynamic_schedule_deactivate_ratio
    return params


# ---- Overrides (``--set section.key=VALUE``) --------------------------------------------------

SET_EXAMPLE = "async_training.staleness_threshold=0.3"
"""The ``--set`` example errors show (valid in every dynres file that has an async_training section)."""


def parse_set_item(item: str) -> tuple[str, Any]:
    """Split one ``--set`` item ``dotted.key=VALUE`` and read VALUE as YAML (``3`` -> int, ``[1, 2]`` -> list).

    An empty VALUE is None. Raises ConfigError naming the item and the fix when there is no ``=``
    or VALUE is not valid YAML.
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: write it as section.key=value, e.g. {SET_EXAMPLE}")
    if not raw.strip():
        return key, None
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError(
            f"--set {key}: value {raw!r} is not valid YAML ({problem}); close its brackets or quotes, "
            f"or quote the whole value as a string, e.g. --set '{key}=\"...\"'"
        ) from None


def parse_set_items(items: Sequence[str]) -> dict[str, Any]:
    """Every ``--set`` item as ``{dotted key: value}`` (a later item for the same key wins)."""
    return dict(parse_set_item(item) for item in items)


def shorthand_overrides(sets: Mapping[str, Any], shorthands: Sequence[tuple[str, str, Any]]) -> dict[str, Any]:
    """The shorthand flags that were given, as ``{dotted key: value}``; each is ``(flag, key, value or None)``.

    A shorthand (``--seed``, ``--policy``, ``--steps``) is another spelling of ``--set KEY=...``;
    given together with ``--set`` for the same key, neither may silently win, so that raises
    ConfigError naming both spellings.
    """
    given: dict[str, Any] = {}
    for flag, key, value in shorthands:
        if value is None:
            continue
        if key in sets:
            raise ConfigError(f"{flag} and --set {key}=... both set {key}; give only one of them")
        given[key] = value
    return given


def set_dotted(data: dict[str, Any], dotted_key: str, value: Any) -> None:
    """Set ``a.b.c = value`` in nested dicts, creating sections on the way; ConfigError on a bad key."""
    parts = dotted_key.split(".")
    if not dotted_key or any(not p for p in parts):
        raise ConfigError(f"--set {dotted_key!r}: a key is dot-separated names, e.g. {SET_EXAMPLE}")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(
                f"--set {dotted_key}: {where!r} is a value ({child!r}), not a section; set {where}=... instead"
            )
        node = child
    node[parts[-1]] = value


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``override`` merged in: mappings merge key by key, other values replace."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A deep copy of ``data`` with each dotted override set (what ``--set`` does before validation)."""
    out = copy.deepcopy(dict(data))
    for dotted, value in (overrides or {}).items():
        set_dotted(out, dotted, value)
    return out
