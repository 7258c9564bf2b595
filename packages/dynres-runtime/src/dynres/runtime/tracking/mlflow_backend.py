"""The ``mlflow`` tracking backend (extra ``dynres-runtime[mlflow]``).

Tracked runs go to an MLflow file store in ``mlruns/`` under the run folder: experiment
``trainer.project_name``, one MLflow run per tracked run (named as it), the flattened config as
params, one metric per tracked metric and cycle (step: global steps) and the summary as metrics
when the run ends. Only :class:`mlflow.tracking.MlflowClient` is used, never MLflow's global
active run, so the runs of one ``dynres simulate`` (and parallel tests) never mix. The extra
installs ``mlflow-skinny`` (the client, without the web UI); ``pip install mlflow`` adds the UI:
``mlflow ui --backend-store-uri <run folder>/mlruns``.

MLflow 3 keeps the file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE``
is true; the backend sets that for this process when it is unset, since a folder per run (no
database to set up) is the point here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dynres.core.hookspecs import hookimpl
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend

FOLDER = "mlruns"
"""The file store's folder under the run folder."""
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"
"""MLflow's switch that lets a client write a file store."""
MAX_PARAM_CHARS = 500
"""Longest param value kept (characters): long lists are cut, so a store never rejects a run."""
PARAMS_PER_BATCH = 100
"""MLflow's limit of params per log_batch call (count)."""


class MlflowTracker(Tracker):
    """One MLflow run in the run folder's file store."""

    def __init__(self, run: TrackedRun) -> None:
        """Create (or reuse) the experiment, start an MLflow run, log the config as params."""
        os.environ.setdefault(ALLOW_FILE_STORE, "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        store = (run.out_dir / FOLDER).resolve()
        store.mkdir(parents=True, exist_ok=True)
        self.uri = store.as_uri()
        self.client: Any = MlflowClient(tracking_uri=self.uri)
        experiment = self.client.get_experiment_by_name(run.project)
        exp_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(run.project)
        self.run_id: str = self.client.create_run(exp_id, run_name=run.name, tags={"dynres.kind": run.kind}).info.run_id
        params = [Param(k[:250], str(v)[:MAX_PARAM_CHARS]) for k, v in run.flat_config().items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])
        self._last_step = 0

    def _metrics(self, metrics: Mapping[str, float], step: int) -> list[Any]:
        from mlflow.entities import Metric
        from mlflow.utils.time import get_current_time_millis

        now = get_current_time_millis()
        return [Metric(key, float(value), now, step) for key, value in metrics.items()]

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the cycle's metrics at ``step`` in one batch."""
        self._last_step = step
        self.client.log_batch(self.run_id, metrics=self._metrics(metrics, step))

    def finish(self, summary: Mapping[str, float]) -> None:
        """Log the summary (``summary/<key>`` at the last step) and end the MLflow run."""
        if summary:
            named = {f"summary/{k}": v for k, v in summary.items()}
            self.client.log_batch(self.run_id, metrics=self._metrics(named, self._last_step))
        self.client.set_terminated(self.run_id)


class MlflowBackend(TrackingBackend):
    """verl's ``mlflow``: an MLflow file store under the run folder."""

    name = "mlflow"
    modules = ("mlflow",)
    extra = "mlflow"
    summary = "mlruns/, an MLflow file store (mlflow ui --backend-store-uri)"

    def open(self, run: TrackedRun) -> Tracker:
        """An :class:`MlflowTracker` for ``run``."""
        return MlflowTracker(run)


@hookimpl
def dynres_tracking_backends() -> list[TrackingBackend]:
    """Offer the ``mlflow`` backend."""
    return [MlflowBackend()]
