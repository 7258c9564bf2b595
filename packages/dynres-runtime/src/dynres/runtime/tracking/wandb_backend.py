"""The ``wandb`` tracking backend (extra ``dynres-runtime[wandb]``).

Each tracked run is one W&B run whose files go to ``wandb/`` under the run folder: project
``trainer.project_name``, named as the tracked run, the config as its config, one history row
per cycle (step: global steps) and the summary in the run's summary. Online or offline is W&B's
own choice (``WANDB_MODE``, ``wandb login``); offline runs are uploaded later with
``wandb sync <run folder>/wandb/offline-run-*``. W&B's console capture and system metrics are
off: the run's terminal belongs to dynres, and a sync cycle's numbers are what is tracked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynres.core.hookspecs import hookimpl
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend


class WandbTracker(Tracker):
    """One W&B run, started with its own settings (several in one process run one after another)."""

    def __init__(self, run: TrackedRun) -> None:
        """Start the W&B run in ``<out_dir>/wandb/``."""
        import wandb

        run.out_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)
        self._run: Any = wandb.init(
            project=run.project,
            name=run.name,
            dir=str(run.out_dir),
            config=dict(run.config),
            settings=settings,
            reinit="create_new",
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One history row at ``step``."""
        self._run.log(dict(metrics), step=step)

    def finish(self, summary: Mapping[str, float]) -> None:
        """Put the summary in the run's summary and finish the run (its files are then complete)."""
        for key, value in summary.items():
            self._run.summary[key] = value
        self._run.finish()


class WandbBackend(TrackingBackend):
    """verl's ``wandb``: a W&B run per tracked run, files under the run folder."""

    name = "wandb"
    modules = ("wandb",)
    extra = "wandb"
    summary = "wandb/, W&B run files (online, or offline with WANDB_MODE=offline)"

    def open(self, run: TrackedRun) -> Tracker:
        """A :class:`WandbTracker` for ``run``."""
        return WandbTracker(run)


@hookimpl
def dynres_tracking_backends() -> list[TrackingBackend]:
    """Offer the ``wandb`` backend."""
    return [WandbBackend()]
