"""What one ``dynres run`` will start, decided and validated before anything starts.

:func:`plan_launch` reads the run file with its overrides (``--set`` items and the shorthand
flags, which may not both set a key), builds the policy so that a bad name or param fails now,
checks the tracking backends of ``trainer.logger`` (names and packages), decides whether plots
can be written and where the output goes (:mod:`dynres.runtime.outdirs`: by default a fresh
``dynres-runs/<run file name>``, never an earlier run's folder; with ``--resume DIR``, DIR and
its latest checkpoint, checked against the run file). :func:`~dynres.runtime.realrun.execute`
then runs the plan's config.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynres.core.config import parse_set_items, shorthand_overrides
from dynres.core.errors import ConfigError, MissingExtraError
from dynres.core.tracking import TrackingBackend
from dynres.runtime.outdirs import default_out_dir, holds_run
from dynres.runtime.realrun.config import RunConfig, load_run_config, load_run_policy
from dynres.runtime.renamed_keys import RENAMED_RUN_KEYS, upgrade_override_keys
from dynres.runtime.tracking import resolve_backends

NO_PLOTS_NOTE = "note: no plots (matplotlib is not installed: pip install 'dynres-runtime[plot]')"
"""Said before a run that would write plots but cannot: plots are optional unless asked for by path."""


@dataclass(frozen=True)
class LaunchPlan:
    """A validated ``dynres run``: its config and where its files go."""

    config: RunConfig
    """The run file with every override applied."""
    out_dir: Path
    """Folder of metrics.jsonl, report.json, backend.json and the plots."""
    plots: bool
    """Write plots (False when not wanted or matplotlib is missing)."""
    plot_dir: Path | None
    """Folder of the plots; None: ``out_dir/plots``."""
    notes: tuple[str, ...] = ()
    """Lines to tell the user before the run starts (e.g. :data:`NO_PLOTS_NOTE`)."""
    tracking: tuple[TrackingBackend, ...] = ()
    """The backends ``trainer.logger`` names, checked (their packages are installed)."""
    default_out: bool = False
    """True when :attr:`out_dir` is the default (``dynres-runs/<name>``, a fresh folder), not ``--out``."""
    resume: dict[str, Any] | None = None
    """The checkpoint of :attr:`out_dir` the run goes on from (``--resume``); None: a fresh run."""


def check_engine_extras(cfg: RunConfig) -> None:
    """Raise MissingExtraError naming the engine's own extra when a module it imports is missing.

    Checked before anything starts (no header, no output folder); for vLLM replicas the message
    names ``[vllm]`` even when torch is what is missing, since that extra brings both.
    """
    for module, extra in cfg.required_extras():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            where = {"ray": "engines.runtime=ray", "vllm": "engines.rollout=vllm", "torch": "engines.trainer=torch"}
            err = MissingExtraError(module, extra)
            err.msg = (
                f"{where[extra]} needs {module!r}, which is not installed; install it with: "
                f"pip install 'dynres-runtime[{extra}]'"
            )
            err.args = (err.msg,)
            raise err


def plan_launch(
    config: str | Path,
    *,
    sets: Sequence[str] = (),
    steps: int | None = None,
    policy: str | None = None,
    address: str | None = None,
    strict: bool = False,
    out_dir: str | Path | None = None,
    plots: bool = True,
    plot_dir: str | Path | None = None,
    on_ignored: Callable[[str], Any] | None = None,
    resume: str | Path | None = None,
) -> LaunchPlan:
    """Load and check run file ``config``; raise a DynresError naming the bad input and the fix.

    :param sets: ``KEY=VALUE`` overrides; ``steps``, ``policy`` and ``address`` are shorthands
        for ``run.steps``, ``async_training.dynamic_schedule_policy`` and ``ray.address``.
    :param strict: reject verl keys dynres does not model; else they are dropped and named in
        one line passed to ``on_ignored``.
    :param plot_dir: the plots' folder; naming one makes a missing matplotlib an error, where
        otherwise the run goes on without plots (and says so in :attr:`LaunchPlan.notes`).
    :param resume: a run folder to go on from its latest checkpoint; the run writes there (an
        ``out_dir`` naming another folder is an error).
    """
    # Renamed keys first, so --set cluster.address=... and --address clash like the new key would.
    overrides = upgrade_override_keys(parse_set_items(sets), RENAMED_RUN_KEYS, "--set")
    shorthands = (
        ("--steps", "run.steps", steps),
        ("--policy", "async_training.dynamic_schedule_policy", policy),
        ("--address", "ray.address", address),
    )
    overrides.update(shorthand_overrides(overrides, shorthands))
    cfg = load_run_config(config, overrides, strict=strict, on_ignored=on_ignored)
    load_run_policy(cfg)
    check_engine_extras(cfg)
    tracking = resolve_backends(cfg.trainer.logger)
    notes: list[str] = []
    if plots:
        from dynres.runtime.plots import plotting_available, require_matplotlib

        if not plotting_available():
            if plot_dir is not None:
                require_matplotlib()  # asked for plots explicitly: one-line error naming the extra
            plots = False
            notes.append(NO_PLOTS_NOTE)
    ckpt = None
    if resume is not None:
        from dynres.runtime.realrun.resume import resume_point

        if out_dir is not None and Path(out_dir).resolve() != Path(resume).resolve():
            raise ConfigError(f"--resume {resume} writes into {resume}; drop --out {out_dir} (or give the same folder)")
        out_dir = resume
        ckpt = resume_point(resume, cfg)
        notes.append(f"note: resuming {resume} from its checkpoint at cycle {ckpt['global_steps']} of {cfg.run.steps}")
    out = Path(out_dir) if out_dir else default_out_dir(Path(config).stem)
    if out_dir and ckpt is None and holds_run(out):
        notes.append(f"note: --out {out} holds an earlier run; its files are replaced")
    plot_path = Path(plot_dir) if plot_dir else None
    return LaunchPlan(cfg, out, plots, plot_path, tuple(notes), tracking, not out_dir, ckpt)
