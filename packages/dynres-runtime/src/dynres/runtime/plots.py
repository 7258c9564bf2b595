"""PNG plots of run reports (``dynres simulate --plot DIR`` and ``dynres run --plot DIR``).

matplotlib comes with the ``[plot]`` extra (``pip install 'dynres-runtime[plot]'``); it is
imported lazily with the non-interactive Agg backend, so plotting works on a headless machine,
importing this module costs nothing, and a training cluster need not install it.

Every plot names its run (``scenario[policy]``) in the title or legend, uses whole-number step
ticks, and leaves out the last step's queue size: the runtime stops generating once the final
cycle's samples are in, so that point always drops towards 0 and says nothing about the policy.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynres.core.errors import ConfigError
from dynres.core.metrics import CLUSTER_UTILIZATION, MQ_SIZE, ROLLOUT_UTILIZATION, TRAIN_UTILIZATION

if TYPE_CHECKING:
    from dynres.runtime.loop.report import RunReport

PLOT_FILES: tuple[str, ...] = (
    "mq_size.png",
    "utilization.png",
    "step_time.png",
    "hybrid_timeline.png",
)
"""Files :func:`write_plots` writes for one run, in order."""

COMPARISON_FILES: tuple[str, ...] = (
    "compare_end_to_end.png",
    "compare_mq_size.png",
    "compare_resource_utilization.png",
    "compare_step_time.png",
)
"""Files :func:`write_comparison_plots` writes for several runs, in order."""

PLOT_EXTRA_HINT = "pip install 'dynres-runtime[plot]'"
"""The install line that brings matplotlib."""

_STATE_LEVEL = {
    "STANDALONE_ONLY": 0,
    "ACTIVATING": 1,
    "DEACTIVATING": 1,
    "REBALANCING": 2,
    "HYBRID_ACTIVE": 2,
}


def plotting_available() -> bool:
    """True when matplotlib (the ``[plot]`` extra) is installed."""
    return importlib.util.find_spec("matplotlib") is not None


def require_matplotlib(option: str = "--plot") -> None:
    """Raise a one-line ConfigError naming the ``[plot]`` extra when matplotlib is missing."""
    if not plotting_available():
        raise ConfigError(
            f"{option} needs matplotlib, which is not installed; install the plot extra: {PLOT_EXTRA_HINT}"
        )


def _pyplot() -> Any:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _out_dir(out_dir: str | Path) -> Path:
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--plot {path}: cannot create the directory ({exc.strerror}); choose a writable path"
        ) from None
    return path


def _steps(report: RunReport) -> list[int]:
    return [c.step for c in report.cycles]


def _integer_steps(ax: Any, *, last_left_out: bool = False) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    note = " (the last step is left out: generation stops before it)" if last_left_out else ""
    ax.set_xlabel(f"step (sync cycle){note}")


def _queue_points(report: RunReport) -> tuple[list[int], list[float]]:
    """Steps and queue sizes without the final step (generation has stopped there; see module doc)."""
    steps, sizes = _steps(report), report.metric_series(MQ_SIZE)
    if len(steps) > 1:
        return steps[:-1], sizes[:-1]
    return steps, sizes


def _title(ax: Any, label: str, what: str) -> None:
    """The run's label over what the plot shows, on two lines: a long label never
    pushes the title past the figure's left edge."""
    ax.set_title(f"{label}\n{what}", fontsize="medium")


def _legend(ax: Any) -> None:
    # Outside the axes, so the legend never covers data.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small")


def _save(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write and close ``fig``; return ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(
    report: RunReport,
    out_dir: str | Path,
    *,
    title: str = "",
    mq_size_cap: int | None = None,
    hybrid_replicas: int | None = None,
) -> list[Path]:
    """Write one run's queue size, utilizations, step time and hybrid timeline PNGs; return paths.

    ``title`` names the run (``scenario[policy]``; default: the policy); ``mq_size_cap`` (samples,
    the most that can wait after a cycle's last fit step: ``loop.spec.mq_size_cap``) is drawn
    on the queue plot when given;
    ``hybrid_replicas`` = 0 marks a static run, whose timeline plot says it has none.
    """
    plt = _pyplot()
    out = _out_dir(out_dir)
    label = title or report.policy
    drawings: tuple[tuple[str, tuple[float, float], Any], ...] = (
        (PLOT_FILES[0], (8, 3.6), lambda ax: _draw_queue(ax, report, label, mq_size_cap)),
        (PLOT_FILES[1], (8, 3.6), lambda ax: _draw_utilization(ax, report, label)),
        (PLOT_FILES[2], (8, 3.6), lambda ax: _draw_step_time(ax, report, label)),
        (PLOT_FILES[3], (9, 2.8), lambda ax: _draw_hybrid_timeline(ax, report, label, hybrid_replicas)),
    )
    paths: list[Path] = []
    for name, size, draw in drawings:
        fig, ax = plt.subplots(figsize=size)
        draw(ax)
        paths.append(_save(plt, fig, out / name))
    return paths


def _draw_queue(ax: Any, report: RunReport, label: str, mq_size_cap: int | None) -> None:
    """The samples waiting after each fit step, and the most that can wait then, when given."""
    qs, qv = _queue_points(report)
    ax.plot(qs, qv, marker=".", label="samples waiting after the fit step")
    if mq_size_cap is not None:
        ax.axhline(mq_size_cap, color="tab:red", linestyle="--", label=f"most that can wait ({mq_size_cap} samples)")
    _title(ax, label, "samples waiting in the queue after each step")
    ax.set(ylabel="samples")
    ax.set_ylim(bottom=0)
    _integer_steps(ax, last_left_out=len(qs) < len(report.cycles))
    _legend(ax)
    ax.grid(alpha=0.3)


def _draw_utilization(ax: Any, report: RunReport, label: str) -> None:
    """The trainer's, the rollout's and the whole cluster's busy fraction per step."""
    steps = _steps(report)
    for key, name in (
        (TRAIN_UTILIZATION, "trainer GPUs (training)"),
        (ROLLOUT_UTILIZATION, "rollout GPUs (generating)"),
        (CLUSTER_UTILIZATION, "whole cluster"),
    ):
        ax.plot(steps, report.metric_series(key), marker=".", label=name)
    _title(ax, label, "how busy the GPUs were in each step")
    ax.set(ylabel="busy fraction", ylim=(0, 1.05))
    _integer_steps(ax)
    _legend(ax)
    ax.grid(alpha=0.3)


def _draw_step_time(ax: Any, report: RunReport, label: str) -> None:
    """The time of each sync cycle."""
    ax.plot(_steps(report), [c.duration_s for c in report.cycles], marker=".")
    _title(ax, label, "time of each step (sync cycle)")
    ax.set(ylabel="seconds")
    ax.set_ylim(bottom=0)
    _integer_steps(ax)
    ax.grid(alpha=0.3)


def _draw_hybrid_timeline(ax: Any, report: RunReport, label: str, hybrid_replicas: int | None) -> None:
    """The controller's state over the run (hours), or why there is none to show."""
    _title(ax, label, "were the trainer's GPUs lent out as hybrid replicas?")
    if hybrid_replicas == 0 or not report.timeline:
        why = (
            "static run: no hybrid replicas (dynamic scheduling is off)"
            if hybrid_replicas == 0
            else "the policy never activated the hybrid replicas"
        )
        ax.text(0.5, 0.5, f"no hybrid timeline: {why}", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs: list[float] = [0.0]
    ys: list[int] = [0]
    for change in report.timeline:
        xs.append(change.at_s / 3600)
        ys.append(_STATE_LEVEL.get(change.new, 1))
    end = max(report.end_to_end_s / 3600, xs[-1])
    xs.append(end)
    ys.append(ys[-1])
    ax.step(xs, ys, where="post")
    ax.set_yticks([0, 1, 2], ["standalone only", "switching", "hybrid active"])
    ax.set(xlabel="hours since the start", xlim=(0, end))
    ax.grid(alpha=0.3)


def write_comparison_plots(
    reports: Mapping[str, RunReport], out_dir: str | Path, *, mq_size_caps: Mapping[str, int] | None = None
) -> list[Path]:
    """Overlay several runs (keys are their labels): end-to-end bars, queue, utilization, step time.

    ``mq_size_caps`` maps a label to the most samples that can wait after its cycles' last fit step;
    distinct values are drawn as dashed lines.
    """
    plt = _pyplot()
    out = _out_dir(out_dir)
    paths: list[Path] = []
    labels = list(reports)
    hours = [reports[k].end_to_end_s / 3600 for k in labels]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(labels) + 1.6))
    bars = ax.barh(range(len(labels)), hours, color="tab:blue")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()  # run #1 on top, as in the table
    first = hours[0]
    for i, (bar, h) in enumerate(zip(bars, hours, strict=True)):
        note = f"{h:.3f} h" if i == 0 or first <= 0 else f"{h:.3f} h ({(h - first) / first * 100:+.1f}% vs #1)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + note, va="center", fontsize="small")
    ax.set(xlabel="hours (shorter is better)", title="end-to-end time of each run")
    ax.set_xlim(0, max(hours) * 1.35 if hours and max(hours) > 0 else 1)
    ax.grid(alpha=0.3, axis="x")
    paths.append(_save(plt, fig, out / "compare_end_to_end.png"))

    for key, name, ylabel, title in (
        (MQ_SIZE, "compare_mq_size.png", "samples", "samples waiting in the queue after each step"),
        (CLUSTER_UTILIZATION, "compare_resource_utilization.png", "busy fraction", "how busy the whole cluster was"),
        ("cycle_time", "compare_step_time.png", "seconds", "time of each step (sync cycle)"),
    ):
        fig, ax = plt.subplots(figsize=(9, 3.8))
        for label, report in reports.items():
            if key == MQ_SIZE:
                xs, ys = _queue_points(report)
            elif key == "cycle_time":
                xs, ys = _steps(report), [c.duration_s for c in report.cycles]
            else:
                xs, ys = _steps(report), report.metric_series(key)
            ax.plot(xs, ys, marker=".", label=label)
        if key == MQ_SIZE and mq_size_caps:
            for cap in sorted(set(mq_size_caps.values())):
                ax.axhline(cap, color="tab:red", linestyle="--", label=f"most that can wait ({cap} samples)")
        if key == CLUSTER_UTILIZATION:
            ax.set_ylim(0, 1.05)
        else:
            ax.set_ylim(bottom=0)
        ax.set(ylabel=ylabel, title=title)
        _integer_steps(ax, last_left_out=key == MQ_SIZE)
        _legend(ax)
        ax.grid(alpha=0.3)
        paths.append(_save(plt, fig, out / name))
    return paths
