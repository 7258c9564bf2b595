"""Checkpoint and resume of a fully-async run: what :meth:`FullyAsyncRun.checkpoint` returns and
how ``RunSpec.resume_from`` is loaded back.

A checkpoint is JSON-serialisable data: the queued samples, the samples interrupted by the end of
the run with their partial output, the step and weight-version counters and the policy's
``state_dict``. Without partial rollout, unfinished responses restart from scratch on resume.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from dynres.core import BoundPolicy
from dynres.core.errors import ConfigError
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

logger = logging.getLogger("dynres.runtime.loop.run")

CHECKPOINT_FORMAT = "dynres.checkpoint/1"
"""Value of the ``format`` key of a checkpoint; a resume refuses any other."""


def make_checkpoint(
    policy: BoundPolicy, tracker: RunTracker, trainer: TrainerLoop, queue: MessageQueue, rollouter: Rollouter
) -> dict[str, Any]:
    """The run's resumable state as JSON-serialisable data (see the module docs)."""
    partial = [
        {
            "group": group_to_dict(p.group),
            "results": [result_to_dict(r) for r in p.results],
            "start_version": p.start_version,
        }
        for p in rollouter.partials
    ]
    return {
        "format": CHECKPOINT_FORMAT,
        "global_steps": tracker.global_steps,
        "weight_version": trainer.version,
        "policy": {"name": policy.name, "state": policy.policy.state_dict()},
        "queue": [sample_to_dict(s) for s in queue.snapshot()],
        "partial": partial,
        "counters": {
            "generated": rollouter.generated,
            "consumed": queue.consumed,
            "dropped_stale": queue.dropped_stale,
        },
    }


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
    logger.info(
        "resuming at global_steps=%d: %d queued samples, %d partial samples",
        tracker.global_steps,
        queue.size,
        len(partials),
    )


def _empty(r: GenerationResult) -> GenerationResult:
    return dataclasses.replace(r, token_ids=[], logprobs=[])
