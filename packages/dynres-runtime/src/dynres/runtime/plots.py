"""PNG plots of a run report (``dynres simulate --plot DIR`` and ``dynres run --plot DIR``).

matplotlib is imported lazily with the non-interactive Agg backend, so plotting works on a
headless machine and importing this module costs nothing.
"""

from __future__ import annotations

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
"""Files :func:`write_plots` writes, in order."""

_STATE_LEVEL = {
    "STANDALONE_ONLY": 0,
    "ACTIVATING": 1,
    "DEACTIVATING": 1,
    "REBALANCING": 2,
    "HYBRID_ACTIVE": 2,
}


def _pyplot() -> Any:
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


def write_plots(report: RunReport, out_dir: str | Path, *, title: str = "") -> list[Path]:
    """Write the queue size, utilizations, step time and hybrid timeline PNGs; return their paths."""
    plt = _pyplot()
    out = _out_dir(out_dir)
    label = title or report.policy
    steps = _steps(report)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, report.metric_series(MQ_SIZE), marker=".", label=label)
    ax.set(xlabel="step (sync cycle)", ylabel="samples", title="queue size after the last fit step (mq_size)")
    ax.grid(alpha=0.3)
    save(fig, "mq_size.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key, name in (
        (TRAIN_UTILIZATION, "train"),
        (ROLLOUT_UTILIZATION, "rollout"),
        (CLUSTER_UTILIZATION, "cluster"),
    ):
        ax.plot(steps, report.metric_series(key), marker=".", label=name)
    ax.set(xlabel="step (sync cycle)", ylabel="fraction", ylim=(0, 1.05), title=f"resource utilization ({label})")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "utilization.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, [c.duration_s for c in report.cycles], marker=".")
    ax.set(xlabel="step (sync cycle)", ylabel="seconds", title=f"sync cycle time ({label})")
    ax.grid(alpha=0.3)
    save(fig, "step_time.png")

    fig, ax = plt.subplots(figsize=(9, 2.8))
    xs: list[float] = [0.0]
    ys: list[int] = [0]
    for change in report.timeline:
        xs.append(change.at_s / 3600)
        ys.append(_STATE_LEVEL.get(change.new, 1))
    xs.append(report.end_to_end_s / 3600)
    ys.append(ys[-1])
    ax.step(xs, ys, where="post")
    ax.set_yticks([0, 1, 2], ["standalone only", "switching", "hybrid active"])
    ax.set(xlabel="hours", title=f"hybrid replicas over time ({label})")
    ax.grid(alpha=0.3)
    save(fig, "hybrid_timeline.png")
    return paths


def write_comparison_plots(reports: Mapping[str, RunReport], out_dir: str | Path) -> list[Path]:
    """Overlay several runs: queue size, cluster utilization and cycle time per step; return paths."""
    plt = _pyplot()
    out = _out_dir(out_dir)
    paths: list[Path] = []
    for key, name, ylabel in (
        (MQ_SIZE, "compare_mq_size.png", "samples"),
        (CLUSTER_UTILIZATION, "compare_resource_utilization.png", "fraction"),
        ("cycle_time", "compare_step_time.png", "seconds"),
    ):
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for label, report in reports.items():
            series = [c.duration_s for c in report.cycles] if key == "cycle_time" else report.metric_series(key)
            ax.plot(_steps(report), series, marker=".", label=label)
        ax.set(xlabel="step (sync cycle)", ylabel=ylabel, title=key.removeprefix("dynamic_resource/"))
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    return paths
