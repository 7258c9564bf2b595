"""Checkpoint and resume of a fully-async run: what :meth:`FullyAsyncRun.checkpoint` returns and
how ``RunSpec.resume_from`` is loaded back.

A checkpoint is JSON-serialisable data holding every admitted sample that was not trained: the
queued samples, and under ``partial`` the samples interrupted by the end of the run and (for a
checkpoint taken during a run) the samples still being generated, each with its finished
responses and the partial output of the unfinished ones. It also holds the step and
weight-version counters, the prompt source's position (``prompts.position``: groups read so
far, over all resumed segments; restart the source there) and the policy's ``state_dict``, which
must be plain JSON (an error names the key otherwise). Without partial rollout, unfinished
responses restart from scratch on resume.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

from dynres.core import BoundPolicy
from dynres.core.errors import ConfigError, PolicyError, PolicyValidationError
from dynres.runtime.loop.cycle import TrainerLoop
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.rollouter import PartialSample, Rollouter
from dynres.runtime.loop.tracker import RunTracker
from dynres.runtime.protocols import GenerationResult
from dynres.runtime.samples import (
    group_from_dict,
    group_to_dict,
    result_from_dict,
    result_to_dict,
    sample_from_dict,
    sample_to_dict,
)

logger = logging.getLogger("dynres.runtime.loop.driver")

CHECKPOINT_FORMAT = "dynres.checkpoint/1"
"""Value of the ``format`` key of a checkpoint; a resume refuses any other."""


def make_checkpoint(
    policy: BoundPolicy, tracker: RunTracker, trainer: TrainerLoop, queue: MessageQueue, rollouter: Rollouter
) -> dict[str, Any]:
    """The run's resumable state as JSON-serialisable data (see the module docs).

    Raises PolicyError when the policy's ``state_dict`` raises or is not plain JSON.
    """
    partial = [
        {
            "group": group_to_dict(p.group),
            "results": [result_to_dict(r) for r in p.results],
            "start_version": p.start_version,
        }
        for p in [*rollouter.partials, *rollouter.in_flight_partials()]
    ]
    return {
        "format": CHECKPOINT_FORMAT,
        "global_steps": tracker.global_steps,
        "weight_version": trainer.version,
        "policy": {"name": policy.name, "state": policy_state(policy)},
        "queue": [sample_to_dict(s) for s in queue.snapshot()],
        "partial": partial,
        "prompts": {"position": rollouter.source_position},
        "counters": {
            "generated": rollouter.generated,
            "consumed": queue.consumed,
            "dropped_stale": queue.dropped_stale,
        },
    }


def policy_state(policy: BoundPolicy) -> Any:
    """The policy's ``state_dict()``, checked to be plain JSON; PolicyError names the key otherwise."""
    try:
        state = policy.policy.state_dict()
    except Exception as exc:
        raise PolicyError(
            f"policy {policy.name!r}: state_dict() raised {type(exc).__name__}: {exc}; "
            "fix state_dict() so a checkpoint can be written"
        ) from exc
    check_plain_json(state, f"policy {policy.name!r} state_dict()")
    return state


def check_plain_json(value: Any, where: str) -> None:
    """Raise PolicyValidationError naming the key path when ``value`` is not plain JSON.

    Plain JSON: dicts with str keys, lists, str, bool, None, int, and finite floats.
    """
    fix = "return only dicts with str keys, lists, str, int, finite float, bool and None"
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PolicyValidationError(f"{where} is {value!r}, which JSON cannot hold; {fix}")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise PolicyValidationError(f"{where} has the key {k!r} ({type(k).__name__}); {fix}")
            check_plain_json(v, f"{where}[{k!r}]")
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            check_plain_json(v, f"{where}[{i}]")
        return
    raise PolicyValidationError(f"{where} is a {type(value).__name__} ({_short(value)}); {fix}")


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def restore_checkpoint(
    ckpt: Mapping[str, Any],
    *,
    policy: BoundPolicy,
    tracker: RunTracker,
    trainer: TrainerLoop,
    queue: MessageQueue,
    rollouter: Rollouter,
    partial_rollout: bool,
) -> None:
    """Load ``ckpt`` into a run that has not started; raise ConfigError when it does not fit."""
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(
            f"RunSpec.resume_from is not a dynres checkpoint (format={ckpt.get('format')!r}, "
            f"expected {CHECKPOINT_FORMAT!r}); pass what FullyAsyncRun.checkpoint() returned"
        )
    pol = ckpt["policy"]
    if pol["name"] != policy.name:
        raise ConfigError(
            f"checkpoint was written by policy {pol['name']!r} but this run uses "
            f"{policy.name!r}; resume with the same policy"
        )
    policy.policy.load_state_dict(pol["state"])
    tracker.global_steps = int(ckpt["global_steps"])
    trainer.version = int(ckpt["weight_version"])
    rollouter.version = int(ckpt["weight_version"])
    queue.restore([sample_from_dict(d) for d in ckpt["queue"]])
    partials = []
    for d in ckpt["partial"]:
        results = [result_from_dict(r) for r in d["results"]]
        if not partial_rollout:  # restart unfinished responses from scratch
            results = [r if not r.aborted else _empty(r) for r in results]
        partials.append(PartialSample(group_from_dict(d["group"]), tuple(results), int(d["start_version"]), 0.0))
    rollouter.add_resumed(partials)
    rollouter.source_position = int(ckpt.get("prompts", {}).get("position", 0))
    logger.info(
        "resuming at global_steps=%d: %d queued samples, %d partial samples",
        tracker.global_steps,
        queue.size,
        len(partials),
    )


def _empty(r: GenerationResult) -> GenerationResult:
    return dataclasses.replace(r, token_ids=[], logprobs=[])
