"""The ``file`` tracking backend: verl's file-logger JSONL under the run folder.

Each tracked run writes ``file/<run name>.jsonl``, one ``{"step": N, "data": {...}}`` line per
sync cycle with the tracked metrics (the lines verl's ``file`` logger writes), flushed line by
line so an interrupted run keeps every finished cycle. ``dynres scenario fit`` reads this format
as a verl run. ``dynres run`` writes its own ``metrics.jsonl`` whatever ``trainer.logger`` says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from dynres.core.hookspecs import hookimpl
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend

FOLDER = "file"
"""The backend's folder under the run folder."""


class FileTracker(Tracker):
    """Appends one verl file-logger line per cycle to the run's JSONL file."""

    def __init__(self, run: TrackedRun) -> None:
        """Create ``<out_dir>/file/<run name>.jsonl`` (replacing an earlier file of that name)."""
        folder = run.out_dir / FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{run.file_name}.jsonl"
        self._fh = self.path.open("w", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Write the cycle's line, flushed."""
        self._fh.write(json.dumps({"step": step, "data": dict(metrics)}) + "\n")
        self._fh.flush()

    def finish(self, summary: Mapping[str, float]) -> None:
        """Close the file (the summary is in report.json, not in verl's per-step format)."""
        self._fh.close()


class FileBackend(TrackingBackend):
    """verl's ``file``: a JSONL file per tracked run; needs nothing."""

    name = "file"
    summary = "file/<run>.jsonl, verl's file-logger lines"

    def open(self, run: TrackedRun) -> Tracker:
        """A :class:`FileTracker` for ``run``."""
        return FileTracker(run)


@hookimpl
def dynres_tracking_backends() -> list[TrackingBackend]:
    """Offer the ``file`` backend."""
    return [FileBackend()]
