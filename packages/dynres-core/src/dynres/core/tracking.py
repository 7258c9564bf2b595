"""Tracking backends: what a plugin implements so that verl's ``trainer.logger`` can name it.

A run (``dynres run``, or each run of ``dynres simulate``) lists backends by name in
``trainer.logger``. Before anything starts, the runtime finds each name among the backends that
``dynres.plugins`` packages return from the ``dynres_tracking_backends`` hook (the built-ins come
from dynres-runtime's own entry points) and calls :meth:`TrackingBackend.check`, so a missing
package is one error line naming what to install. Then it opens one :class:`Tracker` per backend
for each tracked run (:class:`TrackedRun`), hands it every sync cycle's metrics under the names of
:func:`dynres.core.metrics.tracking_metrics` (verl's where verl has one), and finishes it with a
summary when the run ends, also after a failure or Ctrl-C.

A third-party backend is a class with a name, the modules it needs and an ``open`` method,
returned by a hook implementation in a module its distribution lists under
``[project.entry-points."dynres.plugins"]``::

    class SwanLabBackend(TrackingBackend):
        name = "swanlab"
        modules = ("swanlab",)
        distribution = "swanlab"

        def open(self, run: TrackedRun) -> Tracker:
            return SwanLabTracker(run)

    @hookimpl
    def dynres_tracking_backends():
        return [SwanLabBackend()]
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dynres.core.errors import MissingExtraError


@dataclass(frozen=True)
class TrackedRun:
    """One run as a tracking backend sees it: its name, project, folder and configuration."""

    name: str
    """The run's name in the backend: ``trainer.experiment_name``, else the output folder's name
    (``dynres run``) or the ``scenario[policy]`` label (``dynres simulate``)."""
    project: str
    """``trainer.project_name`` (an MLflow experiment, a W&B project)."""
    out_dir: Path
    """The run folder; a backend writes under a folder of its own there (``tensorboard/``, ``mlruns/``)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The run's resolved configuration, JSON-able (a backend's params or config view)."""
    total_steps: int = 0
    """Sync cycles the run will do (count; 0 = unknown)."""
    kind: str = "run"
    """``run`` (a real ``dynres run``) or ``simulate`` (one run of ``dynres simulate``: simulated seconds)."""

    def flat_config(self) -> dict[str, Any]:
        """:attr:`config` as ``{dotted.key: value}`` (lists kept whole), for backends whose params are flat."""
        out: dict[str, Any] = {}

        def walk(prefix: str, node: Any) -> None:
            if isinstance(node, Mapping) and node:
                for key, value in node.items():
                    walk(f"{prefix}{key}.", value)
            else:
                out[prefix[:-1]] = node

        walk("", self.config)
        return out

    @property
    def file_name(self) -> str:
        """:attr:`name` made safe as one file or folder name (path separators replaced)."""
        return self.name.replace("/", "_").replace("\\", "_") or "run"


class Tracker(ABC):
    """An open tracked run of one backend: receives each cycle's metrics, then the summary."""

    @abstractmethod
    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one sync cycle's ``metrics`` (finite numbers, tracking names) at ``step`` (global steps)."""

    def finish(self, summary: Mapping[str, float]) -> None:
        """Record the run's ``summary`` (end-to-end seconds, ...) and close; called once, also after a failure."""
        return  # a tracker with nothing to close keeps this default


class TrackingBackend(ABC):
    """A kind of tracker that ``trainer.logger`` names; instances come from ``dynres_tracking_backends``."""

    name: ClassVar[str] = ""
    """The name ``trainer.logger`` lists (unique over every installed plugin)."""
    modules: ClassVar[tuple[str, ...]] = ()
    """Modules the backend imports when it opens; :meth:`check` finds each before a run starts."""
    distribution: ClassVar[str] = "dynres-runtime"
    """The distribution whose install brings :attr:`modules`."""
    extra: ClassVar[str] = ""
    """The extra of :attr:`distribution` that brings them ('' = the distribution itself)."""
    writes_files: ClassVar[bool] = True
    """True when the backend writes under the run folder (False: it only prints)."""
    summary: ClassVar[str] = ""
    """One line for listings: what it writes and where."""

    @property
    def install_line(self) -> str:
        """The pip command that brings the backend's modules."""
        target = f"'{self.distribution}[{self.extra}]'" if self.extra else self.distribution
        return f"pip install {target}"

    def check(self) -> None:
        """Raise MissingExtraError naming the install line when a module of :attr:`modules` is missing."""
        for module in self.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a parent package missing, or a broken install
                found = False
            if not found:
                err = MissingExtraError(module, self.extra or self.distribution, self.distribution)
                # ImportError prints its msg attribute, not args: set both to the one line.
                err.msg = (
                    f"trainer.logger lists {self.name!r}, which needs {module!r}; it is not installed. "
                    f"Install it with: {self.install_line}"
                )
                err.args = (err.msg,)
                raise err

    @abstractmethod
    def open(self, run: TrackedRun) -> Tracker:
        """Start tracking ``run`` and return its tracker (imports :attr:`modules` here, not at module import)."""
