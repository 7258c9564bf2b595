"""`ScheduleContext`: everything a policy may know when it makes a decision.

One immutable object, built by the runtime (the same code in a real run and in the simulator)
and passed to every policy method. Time is passed in as ``now``; a policy never reads a clock.

Vocabulary used in the field docs:

* a **sample** is one prompt group (a prompt and its ``rollout.n`` responses), the unit the message
  queue holds and the trainer consumes;
* a **collection** is one trainer wait for ``required_samples`` samples (one ``fit_step``);
* a **sync cycle** is ``trigger_parameter_sync_step`` collections followed by one weight sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    computed_field,
    model_validator,
)

COMPUTED_FIELDS: tuple[str, ...] = ("step_required_samples", "buffer_samples", "only_hybrid")
"""Fields derived from the others; accepted on input only when they agree with the derivation."""


def step_required_samples(required_samples: int, trigger_parameter_sync_step: int) -> int:
    """Samples the trainer consumes per sync cycle: required_samples x trigger (count)."""
    return required_samples * trigger_parameter_sync_step


def buffer_samples(step_required: int, staleness_threshold: float) -> int:
    """Extra samples production may run ahead per cycle: int(step_required x staleness) (count).

    The reference documents this as ``expected_samples x staleness`` but computes it from the
    cycle's samples; dynres defines and documents it as the latter.
    """
    return int(step_required * staleness_threshold)


class ScheduleContext(BaseModel):
    """Immutable snapshot of the training run handed to each policy decision (units in fields)."""

    # NaN would slip past every ">= 0" check (all comparisons with NaN are False) and then poison
    # a policy's estimates, so non-finite numbers are rejected outright.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # ---- Step bookkeeping ------------------------------------------------------------------
    global_steps: int = Field(0, ge=0, description="Completed sync cycles (weight syncs) so far; 0 before the first.")
    now: float = Field(0.0, ge=0.0, description="Current time in seconds on the run's clock (virtual in simulation).")
    required_samples: int = Field(
        ..., ge=1, description="Samples per collection (ppo_mini_batch_size x require_batches)."
    )
    trigger_parameter_sync_step: int = Field(
        ..., ge=1, description="Collections per sync cycle (one weight sync per cycle)."
    )
    staleness_threshold: float = Field(
        0.1, ge=0.0, description="Allowed extra production per cycle, as a fraction of a cycle's samples."
    )
    total_steps: int = Field(0, ge=0, description="Sync cycles the run will do in total (count; 0 = unknown).")
    partial_rollout: bool = Field(
        True,
        description="True when an aborted request resumes from its output; False when it starts over and "
        "each weight sync first waits for the running samples to finish (the run's setting).",
    )

    # ---- Sample accounting -----------------------------------------------------------------
    total_generated_samples: int = Field(0, ge=0, description="Samples fully generated since training began (count).")
    expected_samples: int = Field(
        0,
        ge=0,
        description="Samples the trainer has needed through the completed sync cycles "
        "(step_required_samples x global_steps, count).",
    )
    queue_size: int = Field(0, ge=0, description="Samples waiting in the message queue now (count).")
    in_flight_samples: int = Field(0, ge=0, description="Samples being generated on some replica now (count).")
    step_wait_times: tuple[float, ...] = Field(
        (),
        description="Trainer wait per collection of the latest cycle (seconds, one per collection).",
    )
    step_wait_samples: tuple[int, ...] = Field(
        (),
        description="Samples each collection of the latest cycle had to wait for, i.e. "
        "max(0, required_samples - queue size when the wait began) (count, parallel to "
        "step_wait_times).",
    )

    # ---- Cluster and hybrid state ----------------------------------------------------------
    is_hybrid_active: bool = Field(False, description="True while hybrid replicas are registered for generation.")
    num_standalone_replicas: int = Field(
        ..., ge=0, description="Standalone (always generating) replicas in the cluster (count)."
    )
    num_hybrid_replicas: int = Field(..., ge=0, description="Hybrid replicas that share the trainer's GPUs (count).")
    num_active_replicas: int = Field(0, ge=0, description="Replicas routable right now, each counted once (count).")
    shared_host: bool = Field(
        False,
        description="True when every replica generates on one host's compute (one machine's CPU cores): a woken "
        "hybrid replica then adds no throughput, it only divides what the standalone replicas had.",
    )
    last_activate_duration_s: float = Field(
        0.0, ge=0.0, description="Wall time of the latest hybrid activation (seconds; 0 = none yet)."
    )
    last_deactivate_duration_s: float = Field(
        0.0, ge=0.0, description="Wall time of the latest hybrid deactivation (seconds; 0 = none yet)."
    )
    activation_elapsed_s: float = Field(
        0.0,
        ge=0.0,
        description="Time the activation in progress has run so far (seconds; 0 when none is: every decision "
        "but should_abandon_activation).",
    )

    # ---- Measured rates --------------------------------------------------------------------
    generation_rate: float = Field(
        0.0, ge=0.0, description="Samples finished per second over the latest cycle (0 = unknown)."
    )
    consumption_rate: float = Field(
        0.0,
        ge=0.0,
        description="Samples the trainer consumed per second of training over the latest cycle (0 = unknown).",
    )
    last_train_time_s: float = Field(
        0.0, ge=0.0, description="Training compute time of the latest cycle (seconds; 0 = none yet)."
    )
    last_cycle_time_s: float = Field(
        0.0, ge=0.0, description="Wall time of the latest sync cycle (seconds; 0 = none yet)."
    )
    last_hybrid_active_s: float = Field(
        0.0,
        ge=0.0,
        description="Seconds hybrid replicas were routable during the latest sync cycle (seconds; 0 = none).",
    )
    last_hybrid_generated_samples: int = Field(
        0,
        ge=0,
        description="Samples finished while hybrid replicas were routable during the latest sync cycle (count).",
    )
    last_hybrid_tokens: int = Field(
        0,
        ge=0,
        description="Response tokens the hybrid replicas generated during the latest sync cycle, counted when "
        "each request finishes or is aborted (tokens; 0 = none, or the engines do not count tokens).",
    )
    last_standalone_tokens: int = Field(
        0,
        ge=0,
        description="Response tokens the standalone replicas generated during the latest sync cycle, counted "
        "the same way (tokens; 0 = none, or the engines do not count tokens).",
    )
    last_sync_s: float = Field(
        0.0,
        ge=0.0,
        description="Wall time of the latest weight sync: export plus loading into the standalone replicas "
        "(seconds; 0 = none yet).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _accept_computed_fields(cls, data: Any, handler: ModelWrapValidatorHandler[ScheduleContext]) -> ScheduleContext:
        # model_dump()/model_dump_json() include the computed fields; without this a dumped
        # context (a recorded trace, a checkpoint) could not be validated again under extra="forbid".
        given: dict[str, Any] = {}
        if isinstance(data, Mapping) and any(k in data for k in COMPUTED_FIELDS):
            given = {k: data[k] for k in COMPUTED_FIELDS if k in data}
            data = {k: v for k, v in data.items() if k not in given}
        ctx = handler(data)
        for key, value in given.items():
            if value != getattr(ctx, key):
                raise ValueError(
                    f"{key}={value!r} disagrees with the value derived from the other fields "
                    f"({getattr(ctx, key)!r}); drop {key} from the input or fix the fields it "
                    "is derived from"
                )
        return ctx

    @model_validator(mode="after")
    def _check_consistency(self) -> ScheduleContext:
        if len(self.step_wait_times) != len(self.step_wait_samples):
            raise ValueError(
                "step_wait_times and step_wait_samples must have one entry per collection; got "
                f"{len(self.step_wait_times)} and {len(self.step_wait_samples)}"
            )
        if any(t < 0 for t in self.step_wait_times):
            raise ValueError("step_wait_times must be >= 0 seconds")
        if any(n < 0 for n in self.step_wait_samples):
            raise ValueError("step_wait_samples must be >= 0")
        if self.num_standalone_replicas + self.num_hybrid_replicas == 0:
            raise ValueError(
                "a cluster needs at least one replica: num_standalone_replicas and num_hybrid_replicas are both 0"
            )
        if self.num_active_replicas > self.num_standalone_replicas + self.num_hybrid_replicas:
            raise ValueError(
                f"num_active_replicas={self.num_active_replicas} exceeds the cluster's "
                f"{self.num_standalone_replicas + self.num_hybrid_replicas} replicas"
            )
        if self.is_hybrid_active and self.num_hybrid_replicas == 0:
            raise ValueError("is_hybrid_active is True but the cluster has no hybrid replicas")
        return self

    @computed_field  # type: ignore[prop-decorator]  # mypy rejects a decorator over @property; pydantic documents this form
    @property
    def step_required_samples(self) -> int:
        """Samples the trainer consumes per sync cycle (required_samples x trigger, count)."""
        return step_required_samples(self.required_samples, self.trigger_parameter_sync_step)

    @computed_field  # type: ignore[prop-decorator]  # mypy rejects a decorator over @property; pydantic documents this form
    @property
    def buffer_samples(self) -> int:
        """Extra samples production may run ahead per cycle (see :func:`buffer_samples`, count)."""
        return buffer_samples(self.step_required_samples, self.staleness_threshold)

    @computed_field  # type: ignore[prop-decorator]  # mypy rejects a decorator over @property; pydantic documents this form
    @property
    def only_hybrid(self) -> bool:
        """True when the cluster has no standalone replicas (colocated mode)."""
        return self.num_standalone_replicas == 0

    @property
    def surplus_samples(self) -> int:
        """Samples generated beyond what the trainer has needed so far (may be negative, count)."""
        return self.total_generated_samples - self.expected_samples
