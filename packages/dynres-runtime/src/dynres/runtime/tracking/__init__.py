"""Tracking: every sync cycle's metrics to the backends verl's ``trainer.logger`` names.

The backends come from the ``dynres_tracking_backends`` hook of the ``dynres.plugins`` plugins
(:mod:`dynres.core.tracking`); dynres-runtime's own five are plugins of that group too, one
module each: :mod:`.console_backend`, :mod:`.file_backend`, :mod:`.tensorboard_backend`,
:mod:`.mlflow_backend`, :mod:`.wandb_backend`. :func:`resolve_backends` turns the names of a
config into backends, checked (an unknown name or a missing package is one error line, before
anything starts); a :class:`TrackerSet` is one run's open trackers. This package imports only
``dynres.core``, so both apps (``realrun``, ``sim``) use it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

import pluggy

from dynres.core.errors import ConfigError, DynresError, PluginError, did_you_mean
from dynres.core.metrics import tracking_metrics
from dynres.core.plugins import PLUGINS_GROUP, autoload_disabled, get_plugin_manager, register_plugin
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend

logger = logging.getLogger("dynres.runtime.tracking")

RUNTIME_DISTRIBUTION = "dynres-runtime"
"""The distribution whose ``dynres.plugins`` entry points hold the built-in backends."""
LOGGER_KEY = "trainer.logger"
"""The config key that names the backends (verl's)."""


def _plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with every ``dynres.plugins`` plugin; with autoload switched off
    (``DYNRES_DISABLE_PLUGIN_AUTOLOAD``), still with dynres-runtime's own entry points, so the
    built-in backends stay available while third-party plugins are skipped."""
    if not autoload_disabled():
        return get_plugin_manager()
    pm = get_plugin_manager(load_plugins=False)
    for ep in entry_points(group=PLUGINS_GROUP):
        if ep.dist is not None and ep.dist.name == RUNTIME_DISTRIBUTION and not pm.has_plugin(ep.name):
            register_plugin(pm, ep.load(), name=ep.name, origin=f"distribution {RUNTIME_DISTRIBUTION!r}")
    return pm


def installed_backends(pm: pluggy.PluginManager | None = None) -> dict[str, TrackingBackend]:
    """Every tracking backend the plugins offer, by name; a name offered twice is a PluginError naming both."""
    pm = pm if pm is not None else _plugin_manager()
    found: dict[str, tuple[TrackingBackend, str]] = {}
    for impl in pm.hook.dynres_tracking_backends.get_hookimpls():
        plugin = impl.plugin_name
        offered: Any = impl.function() or []  # a plugin's list (None: nothing to offer)
        for backend in offered:
            if not isinstance(backend, TrackingBackend) or not backend.name:
                raise PluginError(
                    f"plugin {plugin!r}: dynres_tracking_backends returned {backend!r}; return instances of "
                    "dynres.core.tracking.TrackingBackend subclasses that set a name"
                )
            if backend.name in found:
                raise PluginError(
                    f"tracking backend {backend.name!r} is offered by plugins {found[backend.name][1]!r} and "
                    f"{plugin!r}; uninstall one of them"
                )
            found[backend.name] = (backend, plugin)
    return {name: backend for name, (backend, _) in sorted(found.items())}


def resolve_backends(names: Sequence[str], *, where: str = LOGGER_KEY) -> tuple[TrackingBackend, ...]:
    """The backends ``names`` lists, each checked; raise ConfigError for an unknown name and
    MissingExtraError (naming the pip line) for a missing package, both before anything starts."""
    if not names:
        return ()
    available = installed_backends()
    chosen = []
    for name in names:
        backend = available.get(name)
        if backend is None:
            raise ConfigError(
                f"{where}: no tracking backend {name!r}{did_you_mean(name, available)}; installed: "
                f"{', '.join(available) or 'none'} (a dynres.plugins package can add more, docs/tracking.md)"
            )
        backend.check()
        chosen.append(backend)
    return tuple(chosen)


class TrackerSet:
    """One run's open trackers: each cycle's record goes to every one, then the summary.

    A tracker that fails while the run goes on is closed and named once through ``warn``; the run
    itself never stops for its tracking. Opening one that fails is a DynresError naming it, raised
    before the run starts (the ones opened before it are closed again).
    """

    def __init__(
        self,
        backends: Iterable[TrackingBackend],
        run: TrackedRun,
        *,
        warn: Callable[[str], Any] | None = None,
    ) -> None:
        """Open a tracker of each of ``backends`` for ``run``; failures to track go to ``warn`` (default: log)."""
        self.run = run
        self.summary: dict[str, float] = {}
        """What :meth:`finish` records when the run ends (the app fills it once the run has a report)."""
        self._warn = warn if warn is not None else logger.warning
        self.trackers: dict[str, Tracker] = {}
        for backend in backends:
            try:
                self.trackers[backend.name] = backend.open(run)
            except DynresError:
                self.finish({})
                raise
            except Exception as exc:  # whatever the backend's library raises
                self.finish({})
                raise PluginError(
                    f"{LOGGER_KEY}: tracking backend {backend.name!r} could not start run {run.name!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc

    def log_record(self, record: Mapping[str, Any]) -> None:
        """Send one per-cycle record (``CycleReport.to_record()``) to every tracker under tracking names."""
        if not self.trackers:
            return
        metrics = tracking_metrics(record)
        step = int(record["step"])
        for name, tracker in list(self.trackers.items()):
            try:
                tracker.log(metrics, step)
            except Exception as exc:
                self._drop(name, exc)

    def finish(self, summary: Mapping[str, float]) -> None:
        """Close every tracker with the run's ``summary`` (each one at most once)."""
        for name, tracker in list(self.trackers.items()):
            del self.trackers[name]
            try:
                tracker.finish(summary)
            except Exception as exc:
                self._warn(f"{LOGGER_KEY}: tracking backend {name!r} failed to finish run {self.run.name!r}: {exc}")

    def _drop(self, name: str, exc: BaseException) -> None:
        """Close a tracker that failed and say so once; the others go on."""
        tracker = self.trackers.pop(name)
        self._warn(
            f"{LOGGER_KEY}: tracking backend {name!r} failed on run {self.run.name!r} and is stopped for it "
            f"({type(exc).__name__}: {exc}); the run goes on"
        )
        try:
            tracker.finish({})
        except Exception:
            pass


__all__ = [
    "LOGGER_KEY",
    "TrackedRun",
    "TrackerSet",
    "TrackingBackend",
    "installed_backends",
    "resolve_backends",
]
