"""Where each admitted sample of a run went, by id, seen from outside the run's own counters.

The simulator's end-to-end check, the fault table and the runtime's tests all ask the same
question of a finished (or failed, or checkpointed) run: was every sample the prompt source handed
out trained exactly once, or still held by the run, or dropped as too stale? The answer needs ids
gathered from outside the run (the prompt source, the train engine) plus what the run still holds,
which :func:`held_sample_ids` reads.

A real run also writes its trained ids down as it goes: :class:`LedgerWriter` appends one line
per trained sample to ``ledger.jsonl`` (``sample_id``, ``cycle``, ``weight_version``, ``segment``),
so that the question can be asked of a run folder after a crash and a resume
(:func:`read_ledger`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynres.runtime.loop.driver import FullyAsyncRun


def checkpoint_sample_ids(checkpoint: Mapping[str, Any] | None) -> list[str]:
    """Ids of the samples a run checkpoint holds: queued first, then partial (empty for None)."""
    if not checkpoint:
        return []
    return [d["group"]["sample_id"] for part in ("queue", "partial") for d in checkpoint[part]]


def held_sample_ids(run: FullyAsyncRun, checkpoint: Mapping[str, Any] | None = None) -> list[str]:
    """Ids ``run`` still holds: queued, partial, and those only in ``checkpoint`` (a failed run's)."""
    held = [s.sample_id for s in run.queue.snapshot()] + [p.group.sample_id for p in run.rollouter.partials]
    seen = set(held)
    return held + [i for i in checkpoint_sample_ids(checkpoint) if i not in seen]


@dataclass(frozen=True)
class SampleLedger:
    """Sample ids of a run, observed outside the run's own counters."""

    admitted: Sequence[str]
    """Ids the prompt source handed to the rollouter, in order."""
    trained: Sequence[str]
    """Ids in the batches the train engine received, in order (repeats would be duplicates)."""
    left: Sequence[str] = field(default_factory=list)
    """Ids the run still holds at the end: queued, partial or in its checkpoint."""
    dropped: Sequence[str] = field(default_factory=list)
    """Ids the queue dropped as too stale (a replacement was admitted for each)."""

    @property
    def duplicated(self) -> list[str]:
        """Ids trained more than once, then ids both trained and still held."""
        twice = sorted(i for i, n in Counter(self.trained).items() if n > 1)
        return twice + sorted(set(self.trained) & set(self.left))

    @property
    def lost(self) -> list[str]:
        """Admitted ids neither trained, nor held, nor dropped as stale."""
        accounted = set(self.trained) | set(self.left) | set(self.dropped)
        return [i for i in self.admitted if i not in accounted]

    @property
    def unknown(self) -> list[str]:
        """Trained ids the prompt source never handed out."""
        return sorted(set(self.trained) - set(self.admitted))

    def problems(self) -> list[str]:
        """What breaks 'each admitted sample trained exactly once, or held, or dropped' ([] = nothing)."""
        out = []
        if dup := self.duplicated:
            out.append(f"{len(dup)} sample(s) trained twice or trained and still held, e.g. {dup[:3]}")
        if lost := self.lost:
            out.append(f"{len(lost)} admitted sample(s) neither trained, held nor dropped, e.g. {lost[:3]}")
        if unknown := self.unknown:
            out.append(f"{len(unknown)} trained sample(s) never admitted, e.g. {unknown[:3]}")
        return out


LEDGER_FILE = "ledger.jsonl"
"""Name of a run folder's ledger: one JSON line per trained sample."""


class LedgerWriter:
    """Appends one line per trained sample to a ledger file, flushed after every train step.

    A line is ``{"sample_id", "cycle", "weight_version", "segment"}``: the sample, the sync cycle
    that trained it (1-based, over all segments), the newest weight version its responses were
    generated with, and the run segment (0 for a fresh run, one more for each resume). A resumed
    run keeps only the lines its checkpoint counted (``keep_lines``): the lines after them belong
    to training that died with the process, and those samples are trained again.
    """

    def __init__(self, path: str | Path, *, segment: int = 0, keep_lines: int | None = None) -> None:
        """Open ``path`` for appending (a fresh run starts it empty; ``keep_lines``: keep that many)."""
        self.path = Path(path)
        """The ledger file."""
        self.segment = segment
        """Run segment written on every line (count of resumes before this run)."""
        kept: list[str] = []
        if keep_lines is not None and self.path.exists():
            kept = self.path.read_text(encoding="utf-8").splitlines()
        self.rolled_back = max(0, len(kept) - (keep_lines or 0))
        """Lines dropped at a resume because their training was lost (count)."""
        kept = kept[: keep_lines or 0]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        self.lines = len(kept)
        """Lines in the file (count): what a checkpoint written now records."""
        self._fh = self.path.open("a", encoding="utf-8")

    def record(self, samples: Sequence[Any], cycle: int) -> None:
        """One line per sample of a train step of sync cycle ``cycle`` (written and flushed now)."""
        out = "".join(
            json.dumps(
                {
                    "sample_id": s.sample_id,
                    "cycle": cycle,
                    "weight_version": s.finish_version,
                    "segment": self.segment,
                }
            )
            + "\n"
            for s in samples
        )
        self._fh.write(out)
        self._fh.flush()
        self.lines += len(samples)

    def close(self) -> None:
        """Close the file (every line written so far stays)."""
        self._fh.close()


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a ledger file, in order (an empty list when there is none; a partial last line,
    which a process killed while writing leaves, is skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # a process killed mid-write leaves a partial last line
                break
            raise
    return out
