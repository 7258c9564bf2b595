"""The ``tensorboard`` tracking backend (extra ``dynres-runtime[tensorboard]``).

Each tracked run writes TensorBoard event files to ``tensorboard/<run name>/`` under the run
folder, one scalar per tracked metric and cycle (x axis: global steps), through TensorBoard's
own writer (``tensorboard.summary.Writer``, no TensorFlow needed). Point ``tensorboard --logdir``
at a run folder's ``tensorboard/`` (or at ``dynres-runs/``): the runs of one
``dynres simulate`` appear side by side, one per ``scenario[policy]`` label.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynres.core.hookspecs import hookimpl
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend

FOLDER = "tensorboard"
"""The backend's folder under the run folder."""


class TensorBoardTracker(Tracker):
    """Writes each cycle's metrics as TensorBoard scalars of one run."""

    def __init__(self, run: TrackedRun) -> None:
        """Open an event-file writer in ``<out_dir>/tensorboard/<run name>/``."""
        from tensorboard.summary import Writer

        self.logdir = run.out_dir / FOLDER / run.file_name
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer: Any = Writer(str(self.logdir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric at ``step``, flushed so a running TensorBoard shows the cycle."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def finish(self, summary: Mapping[str, float]) -> None:
        """Close the event file (the summary is in report.json)."""
        self._writer.close()


class TensorBoardBackend(TrackingBackend):
    """verl's ``tensorboard``: event files under the run folder."""

    name = "tensorboard"
    modules = ("tensorboard",)
    extra = "tensorboard"
    summary = "tensorboard/<run>/ event files (tensorboard --logdir)"

    def open(self, run: TrackedRun) -> Tracker:
        """A :class:`TensorBoardTracker` for ``run``."""
        return TensorBoardTracker(run)


@hookimpl
def dynres_tracking_backends() -> list[TrackingBackend]:
    """Offer the ``tensorboard`` backend."""
    return [TensorBoardBackend()]
