"""Plots a reader understands without the docs: run labels, whole-number steps, the queue cap, no end artefact."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dynres.core.errors import ConfigError
from dynres.runtime import plots
from dynres.runtime.sim import simulate

pytest.importorskip("matplotlib")
# Past the skip, matplotlib and its dependency numpy are there.
import numpy as np
from matplotlib.patches import Rectangle

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@pytest.fixture(scope="module")
def runs() -> list:
    return [
        simulate("seed-dynamic-16-16", policy="default", overrides={"steps": 5}),
        simulate("seed-static-16-16", overrides={"steps": 5}),
    ]


def _figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    """Keep each saved figure (by file name) instead of closing it, to inspect what was drawn."""
    import matplotlib.pyplot as plt

    kept: dict[str, Figure] = {}
    real_close = plt.close

    def close(fig: Any = None) -> None:  # what plt.close takes: a figure, its number or label, "all"
        if fig is not None and hasattr(fig, "savefig"):
            return
        real_close(fig)

    real_savefig = plt.Figure.savefig

    def savefig(self: Figure, fname: Any, *a: Any, **k: Any) -> None:
        kept[Path(str(fname)).name] = self
        real_savefig(self, fname, *a, **k)

    monkeypatch.setattr(plt, "close", close)
    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    return kept


def test_run_plots_name_the_run_draw_the_cap_and_drop_the_last_queue_point(runs, tmp_path, monkeypatch) -> None:
    kept = _figures(monkeypatch)
    r = runs[0]
    paths = plots.write_plots(r.report, tmp_path, title=r.label, mq_size_cap=r.mq_size_cap, hybrid_replicas=16)
    assert [p.name for p in paths] == list(plots.PLOT_FILES)
    for name in plots.PLOT_FILES:
        assert r.label in kept[name].axes[0].get_title(), name
    ax = kept["mq_size.png"].axes[0]
    line, cap = ax.get_lines()[:2]
    assert np.asarray(line.get_xdata()).tolist() == [1, 2, 3, 4]  # step 5 (generation stopped) left out
    # mq_size is read after a cycle's last fit step: it reaches 32 there, not the queue's 96 (issue 30, item 3)
    assert np.asarray(cap.get_ydata()).tolist() == [r.mq_size_cap, r.mq_size_cap] and r.mq_size_cap == 32
    assert max(r.report.metric_series("dynamic_resource/mq_size")) <= r.mq_size_cap
    for name in plots.PLOT_FILES:  # each title lies inside its figure (a long label was cut at the left)
        fig = kept[name]
        fig.canvas.draw()
        box = fig.axes[0].title.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, name
    for name in ("mq_size.png", "utilization.png", "step_time.png"):
        ticks = kept[name].axes[0].get_xticks()
        assert all(float(t).is_integer() for t in ticks), (name, ticks)


def test_static_run_says_it_has_no_hybrid_timeline(runs, tmp_path, monkeypatch) -> None:
    kept = _figures(monkeypatch)
    r = runs[1]
    plots.write_plots(r.report, tmp_path, title=r.label, hybrid_replicas=r.scenario.num_hybrid_replicas)
    texts = [t.get_text() for t in kept["hybrid_timeline.png"].axes[0].texts]
    assert any("static run" in t for t in texts), texts


def test_comparison_has_an_end_to_end_bar_per_run_and_labelled_lines(runs, tmp_path, monkeypatch) -> None:
    kept = _figures(monkeypatch)
    reports = {r.label: r.report for r in runs}
    paths = plots.write_comparison_plots(reports, tmp_path, mq_size_caps={r.label: r.mq_size_cap for r in runs})
    assert [p.name for p in paths] == list(plots.COMPARISON_FILES)
    bars = kept["compare_end_to_end.png"].axes[0]
    assert [t.get_text() for t in bars.get_yticklabels()] == list(reports)
    rects = [p for p in bars.patches if isinstance(p, Rectangle)]
    assert len(rects) == len(bars.patches)  # a bar chart draws rectangles only
    assert [round(p.get_width(), 6) for p in rects] == [round(r.end_to_end_s / 3600, 6) for r in runs]
    for name in plots.COMPARISON_FILES[1:]:
        ax = kept[name].axes[0]
        assert "_" not in ax.get_title() and "dynamic_resource" not in ax.get_title(), ax.get_title()
        drawn = ax.get_legend()
        assert drawn is not None, name
        legend = [t.get_text() for t in drawn.get_texts()]
        assert legend[:2] == list(reports), (name, legend)


def test_missing_matplotlib_is_one_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(plots, "plotting_available", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install 'dynres-runtime\[plot\]'"):
        plots.require_matplotlib()
