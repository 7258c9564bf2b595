"""Checkpoint and resume of a fully-async run: what :meth:`FullyAsyncRun.checkpoint` returns and
how ``RunSpec.resume_from`` is loaded back.

A checkpoint is JSON-serialisable data holding every admitted sample that was not trained: the
queued samples, and under ``partial`` the samples interrupted by the end of the run and (for a
checkpoint taken during a run) the samples still being generated, each with its finished
responses and the partial output of the unfinished ones. It also holds the step and
weight-version counters, the prompt source's position (``prompts.position``: groups read so
far, over all resumed segments; restart the source there) and the policy's ``state_dict``, which
must be plain JSON (an error names the key otherwise), and under ``dropped`` the ids the queue
dropped as too stale, over all segments. Without partial rollout, unfinished responses restart
from scratch on resume.

:class:`CheckpointStore` keeps such checkpoints on disk, together with the train engine's own
state (weights, optimizer; :class:`~dynres.runtime.protocols.CheckpointableTrainEngine`), so
that a run killed at any moment can be resumed from its latest complete checkpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynres.core import BoundPolicy
from dynres.core.errors import ConfigError, DynresError, PolicyError, PolicyValidationError
from dynres.runtime.loop.cycle import TrainerLoop
from dynres.runtime.loop.ledger import LedgerWriter
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.queue import MessageQueue
from dynres.runtime.loop.rollouter import PartialSample, Rollouter
from dynres.runtime.loop.tracker import RunTracker
from dynres.runtime.protocols import CheckpointableTrainEngine, GenerationResult, TrainEngine
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
    policy: BoundPolicy,
    tracker: RunTracker,
    trainer: TrainerLoop,
    queue: MessageQueue,
    rollouter: Rollouter,
    *,
    dropped_before: Sequence[str] = (),
    restarts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The run's resumable state as JSON-serialisable data (see the module docs).

    ``dropped_before``: ids dropped as stale by the segments before this one (from the checkpoint
    it resumed); ``restarts``: the replica restarts so far, over every segment (kept under
    ``replica_restarts`` for the record). Raises PolicyError when the policy's ``state_dict``
    raises or is not plain JSON.
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
        "dropped": [*dropped_before, *queue.dropped_ids],
        "replica_restarts": [dict(r) for r in restarts],
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


CHECKPOINTS_DIR = "checkpoints"
"""Folder of a run folder's checkpoints."""
LATEST_FILE = "latest.json"
"""File in :data:`CHECKPOINTS_DIR` naming the newest complete checkpoint."""
RUN_STATE_FILE = "run.json"
"""File of one checkpoint holding the sample side (:func:`make_checkpoint`'s data and more)."""
TRAINER_DIR = "trainer"
"""Folder of one checkpoint the train engine's ``save_state`` writes into."""
CYCLE_RECORD_KEY = "cycle_record"
"""Key of a checkpoint on disk holding its cycle's metrics record (``CycleReport.to_record``) as it
stood at the checkpoint, before the cycle's decisions: the record is written after them, so a
process killed in between would otherwise lose it for good (a resumed run starts after the cycle)."""


class CheckpointStore:
    """A run folder's checkpoints on disk, written so that no crash leaves a broken latest one.

    Layout under ``root``: ``step-000010/run.json`` (the sample side, plus whatever the caller adds:
    the ledger's line count, the run segment), ``step-000010/trainer/`` (what the train engine's
    ``save_state`` wrote) and ``latest.json`` naming the newest. A checkpoint is built in a hidden
    folder and renamed into place once complete; then ``latest.json`` is replaced by a temporary
    file renamed over it. A process killed at any moment therefore leaves the previous latest
    checkpoint whole, and :meth:`latest` never names a half-written one. The newest ``keep``
    checkpoints stay; older ones are removed after a new one is in place.
    """

    def __init__(self, root: str | Path, *, keep: int = 2) -> None:
        """Keep checkpoints in folder ``root`` (created on the first save); keep the newest ``keep``."""
        self.root = Path(root)
        """The checkpoints' folder."""
        self.keep = max(1, keep)
        """Checkpoints kept (count, at least 1)."""
        self.saved: list[int] = []
        """Cycles of the checkpoints this store wrote, in order."""

    def latest(self) -> Path | None:
        """The newest complete checkpoint's folder, or None when there is none.

        ``latest.json`` names it; when that file is missing or unreadable (a copy of the folder,
        a filesystem that lost it), the complete folder of the highest cycle is taken.
        """
        try:
            name = json.loads((self.root / LATEST_FILE).read_text(encoding="utf-8"))["path"]
            path = self.root / str(name)
            if (path / RUN_STATE_FILE).is_file():
                return path
        except (OSError, ValueError, KeyError, TypeError):
            pass
        done = sorted(p for p in self.root.glob("step-*") if (p / RUN_STATE_FILE).is_file())
        return done[-1] if done else None

    def load(self, path: str | Path | None = None) -> dict[str, Any]:
        """The run state of checkpoint folder ``path`` (None: the latest); ConfigError when there is none."""
        where = Path(path) if path is not None else self.latest()
        if where is None:
            raise ConfigError(
                f"no checkpoint in {self.root}: the run wrote none yet (run.checkpoint_every cycles); "
                "start it again without --resume"
            )
        try:
            state = json.loads((where / RUN_STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"checkpoint {where} cannot be read ({exc}); resume from an older one") from exc
        state["path"] = str(where)
        return state

    async def save(self, step: int, state: Mapping[str, Any], train_engine: TrainEngine | None) -> Path:
        """Write checkpoint ``step`` (a cycle count): the train engine's state, then ``state``.

        A train engine that cannot save its state (not a CheckpointableTrainEngine) leaves
        ``trainer: null`` in run.json: a resume then starts from the initial weights.
        """
        tmp = self.root / f".tmp-step-{step:06d}-{os.getpid()}"
        await asyncio.to_thread(_fresh_dir, tmp)
        data = dict(state)
        data["trainer"] = None
        # A proxy has the methods whatever it hosts; it says whether the engine behind it saves.
        if isinstance(train_engine, CheckpointableTrainEngine) and getattr(train_engine, "can_save_state", True):
            (tmp / TRAINER_DIR).mkdir()
            await train_engine.save_state(str(tmp / TRAINER_DIR))
            data["trainer"] = TRAINER_DIR
        else:
            logger.warning("the train engine cannot save its state; checkpoint %d holds the sample side only", step)
        final = await asyncio.to_thread(self._commit, tmp, step, data)
        self.saved.append(step)
        return final

    def _commit(self, tmp: Path, step: int, data: Mapping[str, Any]) -> Path:
        """Write run.json, rename the folder into place, point latest.json at it, prune old ones."""
        _write_synced(tmp / RUN_STATE_FILE, json.dumps(data))
        final = self.root / f"step-{step:06d}"
        if final.exists():  # written by a segment that died before it got further: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = self.root / f".{LATEST_FILE}.tmp"
        _write_synced(latest_tmp, json.dumps({"path": final.name, "step": step}))
        os.replace(latest_tmp, self.root / LATEST_FILE)
        complete = sorted(p for p in self.root.glob("step-*") if p != final)
        # Older checkpoints beyond `keep`, and what killed writers left half-built.
        for old in [*complete[: max(0, len(complete) - (self.keep - 1))], *self.root.glob(".tmp-step-*")]:
            shutil.rmtree(old, ignore_errors=True)
        return final


def _fresh_dir(path: Path) -> None:
    """Make ``path`` an empty folder (a leftover of an earlier attempt is removed first)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and flush it to disk before returning (it is renamed next)."""
    with path.open("w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


async def save_checkpoint(
    store: CheckpointStore,
    step: int,
    state: Callable[[], dict[str, Any]],
    *,
    train_engine: TrainEngine,
    ledger: LedgerWriter | None,
    ops: OpRunner,
) -> Path | None:
    """Write checkpoint ``step`` to ``store``: ``state()`` (the sample side, taken now) with the
    ledger's line count and segment, and the train engine's state; return its folder.

    A checkpoint that cannot be written is an operation failure (``checkpoint``) in the report and
    a logged error, not the end of the run: the previous one stays the latest (returns None).
    """
    try:
        data = state()
    except DynresError as exc:  # the policy's state_dict
        ops.record_failure("checkpoint", "run", str(exc), timeout=False)
        return None
    if ledger is not None:
        data.update(segment=ledger.segment, ledger_lines=ledger.lines)
    try:
        return await ops.one("checkpoint", "trainer", lambda: store.save(step, data, train_engine))
    except DynresError as exc:
        logger.error("checkpoint at cycle %d not written: %s", step, exc)
        return None


async def load_train_state(ckpt: Mapping[str, Any], train_engine: TrainEngine, ops: OpRunner) -> None:
    """Load the train engine's state a checkpoint on disk holds (``path`` and ``trainer`` keys, as
    :meth:`CheckpointStore.load` returns them); nothing for an in-memory or sample-only checkpoint."""
    folder = ckpt.get("trainer")
    if not folder or not ckpt.get("path"):
        return
    if not (isinstance(train_engine, CheckpointableTrainEngine) and getattr(train_engine, "can_save_state", True)):
        raise ConfigError(
            f"checkpoint {ckpt['path']} holds a train state but this train engine cannot load one; "
            "resume with the engine the run was started with"
        )
    path = str(Path(str(ckpt["path"])) / str(folder))
    await ops.one("load_state", "trainer", lambda: train_engine.load_state(path))
