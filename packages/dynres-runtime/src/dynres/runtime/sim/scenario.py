"""Scenario files: what the simulator runs, validated with pydantic (``extra="forbid"``).

A scenario is a YAML mapping::

    description: one line shown by ``dynres simulate --list-presets``
    extends: seed-dynamic-16-16      # optional: start from a preset (or file) and override keys
    steps: 50                        # sync cycles (one weight sync each) to simulate
    seed: 0                          # RNG seed of the workload (response lengths)
    async_training: {...}            # verl's keys, dynres.core.config.AsyncTrainingConfig
    actor_rollout_ref: {...}         # verl's keys: actor.ppo_mini_batch_size, rollout.n, memory
    cluster: {trainer_gpus: 16, rollout_gpus: 16, gpus_per_replica: 4}
    workload: {prompt_tokens, response: {...}, decode: {...}, train: {...}}
    costs: {weight_sync_s, sleep_s, wake_up_s, ...}
    trainer: {logger: [tensorboard]}  # optional: verl's tracking keys (one tracked run per label)

Every section is documented field by field below; units are in each field's description.
Presets are scenario files shipped in ``dynres/runtime/sim/presets/`` (see :mod:`.presets`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from dynres.core.config import (
    ActorRolloutRefConfig,
    AsyncTrainingConfig,
    DynresConfig,
    NodesConfig,
    StrictModel,
    TrackingConfig,
    apply_overrides,
    deep_merge,
    validate_model,
)
from dynres.core.context import step_required_samples
from dynres.core.errors import ConfigError, ScenarioError
from dynres.core.metrics import TRAIN_COMPUTE_PHASES


class ClusterConfig(StrictModel):
    """GPUs of the simulated cluster: the trainer's (hybrid replicas live there) and the rollout's."""

    trainer_gpus: int = Field(16, ge=1, description="GPUs that train (and host hybrid replicas) (count).")
    rollout_gpus: int = Field(16, ge=0, description="GPUs of standalone rollout replicas (count; 0 = only hybrid).")
    gpus_per_replica: int = Field(
        1, ge=1, description="GPUs one inference replica spans (tensor parallel size, count)."
    )
    shared_host: bool = Field(
        False,
        description="All replicas share one host's compute (a CPU-only machine): the generating replicas "
        "divide the standalone replicas' combined peak (tokens/s), so a woken hybrid replica adds no "
        "throughput (true/false; false = every replica has its own GPUs).",
    )

    @model_validator(mode="after")
    def _divisible(self) -> ClusterConfig:
        for key in ("trainer_gpus", "rollout_gpus"):
            gpus = getattr(self, key)
            if gpus % self.gpus_per_replica:
                raise ValueError(
                    f"cluster.{key}={gpus} is not a multiple of cluster.gpus_per_replica="
                    f"{self.gpus_per_replica}; replicas cannot span a partial GPU group"
                )
        return self

    @property
    def total_gpus(self) -> int:
        """All GPUs (count)."""
        return self.trainer_gpus + self.rollout_gpus


class ResponseLengthConfig(StrictModel):
    """Long-tailed response lengths: lognormal, correlated within a prompt group, capped, growing."""

    median_tokens: float = Field(2000.0, gt=0, description="Median response length at step 0 before capping (tokens).")
    sigma: float = Field(
        1.07, ge=0.0, le=4.0, description="Standard deviation of log(length) (nats; 0 = constant length)."
    )
    max_tokens: int = Field(16384, ge=1, description="Cap on a response's length, the engine's max_tokens (tokens).")
    group_correlation: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="Share of log-length variance common to a prompt group's responses (fraction).",
    )
    growth_per_step: float = Field(
        0.0,
        gt=-1.0,
        le=1.0,
        description="Multiplicative growth of the median per sync cycle (fraction per step; 0.004 = +0.4%/step).",
    )
    prompt_pool: int = Field(
        0,
        ge=0,
        description="Distinct prompts, cycled over: sample i asks prompt i mod prompt_pool, whose group-common "
        "length draw is the same in every epoch, so a prompt's earlier lengths predict the next (count; 0 = every "
        "sample is a new prompt).",
    )


class DecodeConfig(StrictModel):
    """Replica speed: saturating aggregate decode throughput and the cost of (re-)prefill."""

    peak_tokens_per_s: float = Field(
        4000.0,
        gt=0,
        description="Saturated aggregate decode throughput of one standalone replica (tokens/s).",
    )
    lone_request_fraction: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="Throughput of a replica serving one request, as a fraction of peak (fraction).",
    )
    prefill_cost: float = Field(
        0.1,
        ge=0.0,
        description="Replica work of prefilling one token, in decode tokens (decode tokens/token).",
    )
    hybrid_speed_factor: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Peak throughput of a hybrid replica relative to a standalone one (fraction; "
        "models its smaller KV cache).",
    )

    @property
    def c_half(self) -> float:
        """Concurrency at which throughput is half of peak: (1 - f) / f (requests)."""
        f = self.lone_request_fraction
        return (1.0 - f) / f


class TrainConfig(StrictModel):
    """Trainer speed: seconds of one fit step, scaling with batch tokens and trainer GPUs."""

    step_s: float = Field(
        60.0,
        gt=0,
        description="Compute seconds of one fit step on reference_gpus GPUs for a batch of the "
        "step-0 mean size (seconds).",
    )
    reference_gpus: int = Field(16, ge=1, description="Trainer GPUs step_s was measured on (count).")
    scaling_exponent: float = Field(
        1.0,
        ge=0.0,
        le=1.5,
        description="Step time scales as (reference_gpus / trainer_gpus) ** exponent (1 = linear).",
    )
    optimizer_offload_below_gpus: int = Field(
        0,
        ge=0,
        description="With fewer trainer GPUs than this the training state does not fit in GPU "
        "memory and the optimizer is offloaded to CPU (count; 0 = never).",
    )
    optimizer_offload_slowdown: float = Field(
        1.0, ge=1.0, le=10.0, description="Factor on step time while the optimizer is offloaded (x)."
    )
    token_fraction: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of step_s proportional to the batch's tokens; the rest is fixed (fraction).",
    )
    phase_fractions: dict[str, float] = Field(
        default_factory=lambda: {"update_actor": 0.95, "old_log_prob": 0.03, "reward": 0.01, "adv": 0.01},
        description="Split of a step's compute into trainer phases (fractions summing to 1).",
    )

    @model_validator(mode="after")
    def _phases(self) -> TrainConfig:
        bad = sorted(set(self.phase_fractions) - set(TRAIN_COMPUTE_PHASES))
        if bad:
            raise ValueError(
                f"workload.train.phase_fractions: unknown phase {bad[0]!r}; use some of "
                f"{', '.join(TRAIN_COMPUTE_PHASES)}"
            )
        if any(v < 0 for v in self.phase_fractions.values()):
            raise ValueError("workload.train.phase_fractions: fractions must be >= 0")
        total = sum(self.phase_fractions.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"workload.train.phase_fractions must sum to 1, got {total:g}")
        return self


class WorkloadConfig(StrictModel):
    """The work of the run: prompts, response lengths, replica speed and trainer speed."""

    prompt_tokens: int = Field(256, ge=1, description="Prompt length of every sample (tokens).")
    response: ResponseLengthConfig = Field(
        default_factory=ResponseLengthConfig, description="Response length distribution."
    )
    decode: DecodeConfig = Field(default_factory=DecodeConfig, description="Replica speed.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Trainer speed.")


class CostsConfig(StrictModel):
    """Durations of the operations around generation and training (seconds)."""

    weight_sync_s: float = Field(
        5.0, ge=0.0, description="One replica receiving and loading a weight update (seconds)."
    )
    export_weights_s: float = Field(0.0, ge=0.0, description="Trainer exporting one weight update (seconds).")
    sleep_s: float = Field(3.0, ge=0.0, description="Replica sleep: free KV cache, offload weights (seconds).")
    wake_up_s: float = Field(3.0, ge=0.0, description="Replica wake-up: reload weights and KV cache (seconds).")
    abort_s: float = Field(0.1, ge=0.0, description="Replica aborting its in-flight requests (seconds).")
    trainer_offload_s: float = Field(
        3.0, ge=0.0, description="Trainer moving parameters and optimizer state off the GPUs (seconds)."
    )
    trainer_onload_s: float = Field(3.0, ge=0.0, description="Trainer bringing them back (seconds).")


class ScenarioTracking(TrackingConfig):
    """verl's tracking keys in a scenario: none by default, since ``dynres simulate`` prints its own tables."""

    logger: list[str] = Field(
        default_factory=list,
        json_schema_extra={"default": []},
        description="Tracking backends that get each simulated cycle's metrics, one tracked run per "
        "scenario[policy] label (console, file, tensorboard, mlflow, wandb or a plugin's; none by default).",
    )


class Scenario(StrictModel):
    """One simulated training run: cluster, config, workload, costs, length and seed."""

    name: str = Field("", description="Preset or file name (filled in when loaded; free text).")
    description: str = Field("", description="One line describing the scenario.")
    steps: int = Field(20, ge=1, le=100_000, description="Sync cycles (weight syncs) to simulate (count).")
    seed: int = Field(0, ge=0, description="Seed of the workload's random numbers (response lengths).")
    async_training: AsyncTrainingConfig = Field(
        default_factory=AsyncTrainingConfig, description="verl's async_training section."
    )
    actor_rollout_ref: ActorRolloutRefConfig = Field(
        default_factory=ActorRolloutRefConfig,
        description="verl's actor_rollout_ref keys (mini-batch size, rollout.n, memory fractions); "
        "GPUs per replica come from cluster.gpus_per_replica.",
    )
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="The GPUs.")
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig, description="The work.")
    costs: CostsConfig = Field(default_factory=CostsConfig, description="Operation durations.")
    trainer: ScenarioTracking = Field(
        default_factory=ScenarioTracking,
        description="verl's tracking keys (the GPUs are in cluster).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        rollout = self.actor_rollout_ref.rollout
        tp = self.cluster.gpus_per_replica
        if "tensor_model_parallel_size" in rollout.model_fields_set and rollout.tensor_model_parallel_size != tp:
            raise ValueError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size="
                f"{rollout.tensor_model_parallel_size} disagrees with cluster.gpus_per_replica={tp}; "
                "set only cluster.gpus_per_replica"
            )
        if self.cluster.rollout_gpus == 0 and not self.async_training.use_dynamic_resource_scheduling:
            raise ValueError(
                "cluster.rollout_gpus is 0 (only hybrid replicas) but "
                "async_training.use_dynamic_resource_scheduling is false, so nothing would "
                "generate; set it to true or give cluster.rollout_gpus >= gpus_per_replica"
            )
        if self.workload.prompt_tokens + 1 > 10_000_000:
            raise ValueError("workload.prompt_tokens is implausibly large (> 10M tokens)")
        return self

    # ---- Derived quantities ---------------------------------------------------------------

    def dynres_config(self) -> DynresConfig:
        """The runtime's DynresConfig for this scenario (one node per pool, GPUs from cluster)."""
        c = self.cluster
        aro = self.actor_rollout_ref.model_dump()
        aro["rollout"]["tensor_model_parallel_size"] = c.gpus_per_replica
        data = {
            "async_training": self.async_training.model_dump(),
            "actor_rollout_ref": aro,
            "trainer": NodesConfig(nnodes=1, n_gpus_per_node=c.trainer_gpus).model_dump(),
            "rollout": NodesConfig(
                nnodes=1 if c.rollout_gpus else 0, n_gpus_per_node=max(1, c.rollout_gpus)
            ).model_dump(),
        }
        try:
            return validate_model(DynresConfig, data, f"scenario {self.name or '(unnamed)'}")
        except ConfigError as exc:
            raise ScenarioError(str(exc)) from None

    @property
    def required_samples(self) -> int:
        """Samples per fit step: ppo_mini_batch_size x require_batches (count)."""
        return self.actor_rollout_ref.actor.ppo_mini_batch_size * self.async_training.require_batches

    @property
    def step_required_samples(self) -> int:
        """Samples per sync cycle: required_samples x trigger_parameter_sync_step (count)."""
        return step_required_samples(self.required_samples, self.async_training.trigger_parameter_sync_step)

    @property
    def responses_per_sample(self) -> int:
        """Responses per sample, rollout.n (count)."""
        return self.actor_rollout_ref.rollout.n

    @property
    def num_standalone_replicas(self) -> int:
        """Standalone replicas (count)."""
        return self.cluster.rollout_gpus // self.cluster.gpus_per_replica

    @property
    def num_hybrid_replicas(self) -> int:
        """Hybrid replicas on the trainer's GPUs; 0 without dynamic scheduling (count)."""
        if not self.async_training.use_dynamic_resource_scheduling:
            return 0
        return self.cluster.trainer_gpus // self.cluster.gpus_per_replica

    @property
    def policy_name(self) -> str:
        """The policy the scenario names (async_training.dynamic_schedule_policy)."""
        return self.async_training.dynamic_schedule_policy

    def summary(self) -> str:
        """One line: GPUs, replicas, batch and length of the run."""
        c = self.cluster
        mode = f"dynamic ({self.policy_name})" if self.async_training.use_dynamic_resource_scheduling else "static"
        return (
            f"{c.trainer_gpus} trainer + {c.rollout_gpus} rollout GPUs, {mode}, "
            f"{self.num_standalone_replicas} standalone + {self.num_hybrid_replicas} hybrid "
            f"replicas of {c.gpus_per_replica} GPU(s), {self.steps} steps x "
            f"{self.step_required_samples} samples x n={self.responses_per_sample}"
        )


# ---- Loading -------------------------------------------------------------------------------

MAX_EXTENDS_DEPTH = 8
"""Longest chain of ``extends`` allowed (count); deeper chains are almost surely cycles."""


def resolve_raw(
    source: str | Path | Mapping[str, Any], *, _depth: int = 0, _label: str | None = None
) -> tuple[dict[str, Any], str]:
    """Load a scenario's raw mapping with ``extends`` resolved; return it and a display name.

    ``source`` is a preset name, a YAML path or a mapping.
    """
    from dynres.core.config import read_yaml
    from dynres.runtime.sim import presets

    if _depth > MAX_EXTENDS_DEPTH:
        raise ScenarioError(
            f"scenario {_label!r}: 'extends' chains more than {MAX_EXTENDS_DEPTH} scenarios deep "
            "(is there a cycle?); extend a preset directly"
        )
    if isinstance(source, Mapping):
        data: Any = dict(source)
        label = _label or str(data.get("name") or "(inline scenario)")
    else:
        text = str(source)
        path = Path(text)
        if path.suffix in (".yaml", ".yml") or path.exists() or "/" in text:
            try:
                data = read_yaml(path)
            except ConfigError as exc:
                raise ScenarioError(str(exc)) from None
            label = path.stem
        else:
            data = presets.preset_raw(text)
            label = text
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ScenarioError(
            f"scenario {label!r}: expected a mapping of keys at the top level, got {type(data).__name__}"
        )
    data = dict(data)
    parent = data.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str) or not parent:
            raise ScenarioError(f"scenario {label!r}: 'extends' must name a preset or a YAML file, got {parent!r}")
        if not isinstance(source, Mapping) and not presets.is_preset(parent):
            # A relative file path in 'extends' is relative to the extending file.
            candidate = Path(str(source)).parent / parent
            if candidate.exists():
                parent = str(candidate)
        base, _ = resolve_raw(parent, _depth=_depth + 1, _label=label)
        base.pop("name", None)
        base.pop("description", None)
        data = deep_merge(base, data)
    return data, label


def config_overrides(cfg: DynresConfig) -> dict[str, Any]:
    """The dotted scenario keys a run config sets (what ``dynres simulate --config`` applies).

    Only keys the config file gives count (pydantic's set fields), so a scenario keeps its own
    values for everything else: ``async_training.*`` and ``actor_rollout_ref.*`` as they are,
    the rollout's tensor-parallel size as ``cluster.gpus_per_replica``, and the ``trainer`` and
    ``rollout`` node sections as ``cluster.trainer_gpus`` / ``cluster.rollout_gpus`` (GPUs). The
    ``trainer`` section's tracking keys (``trainer.logger``: where the real run logs) do not
    apply to simulations; a scenario's own ``trainer.logger`` or ``--set`` tracks those.
    """
    out: dict[str, Any] = {}

    def leaves(prefix: str, node: Any) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping) and value:
                leaves(f"{prefix}{key}.", value)
            else:
                out[f"{prefix}{key}"] = value

    leaves("async_training.", cfg.async_training.model_dump(exclude_unset=True))
    aro = cfg.actor_rollout_ref.model_dump(exclude_unset=True)
    tp = aro.get("rollout", {}).pop("tensor_model_parallel_size", None)
    if tp is not None:
        out["cluster.gpus_per_replica"] = tp
    leaves("actor_rollout_ref.", aro)
    trainer_set = cfg.trainer.model_fields_set if "trainer" in cfg.model_fields_set else set()
    if trainer_set & set(NodesConfig.model_fields):
        out["cluster.trainer_gpus"] = cfg.trainer.n_gpus
    if "rollout" in cfg.model_fields_set:
        out["cluster.rollout_gpus"] = cfg.rollout.n_gpus
    return out


def load_scenario(
    source: str | Path | Mapping[str, Any] | Scenario,
    *,
    overrides: Mapping[str, Any] | None = None,
) -> Scenario:
    """Load and validate a scenario from a preset name, YAML path, mapping or Scenario.

    ``overrides`` maps dotted keys to values (what ``--set`` passes). Raises ScenarioError naming
    the bad key (with a did-you-mean for typos) and how to fix it.
    """
    if isinstance(source, Scenario):
        if not overrides:
            return source
        raw, label = source.model_dump(), source.name
    else:
        raw, label = resolve_raw(source)
    try:
        raw = apply_overrides(raw, overrides)
        raw.setdefault("name", label)
        return validate_model(Scenario, raw, f"scenario {label!r}")
    except ConfigError as exc:
        raise ScenarioError(str(exc)) from None
