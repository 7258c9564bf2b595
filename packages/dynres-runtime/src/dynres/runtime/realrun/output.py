"""Files of a ``dynres run``: the per-cycle JSONL stream, report.json, backend.json, plots, summary lines.

``reward_key`` is :func:`dynres.core.metrics.reward_key`, re-exported for the CLI and tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynres.core.metrics import reward_key as reward_key  # re-exported (realrun.reward_key)

if TYPE_CHECKING:
    from dynres.runtime.tracking import TrackerSet

METRICS_FILE = "metrics.jsonl"
"""One JSON record per sync cycle (``dynamic_resource/*`` keys, train metrics, counters)."""
REPORT_FILE = "report.json"
"""The RunReport (same payload as ``dynres run --json``)."""
BACKEND_FILE = "backend.json"
"""Where things ran: nodes, engine start times, event-loop lag of every actor, lost replicas."""
CONFIG_FILE = "config.json"
"""The run's resolved configuration (RunConfig, overrides applied); ``dynres scenario fit`` reads it."""
PLOTS_DIR = "plots"
"""Subdirectory of the output directory that holds the plots."""


def operations_lines(report: Any) -> list[str]:
    """Human summary: dynres's own overhead next to each engine operation's time (seconds)."""
    ops = report.operations
    lines = [
        (
            f"controller overhead {ops.controller_overhead_s:.3f} s over {ops.activations} activations, "
            f"{ops.deactivations} deactivations, {ops.rebalances} rebalances; policy decisions "
            f"{ops.policy_wall_s * 1000:.1f} ms wall"
        ),
    ]
    for name in sorted(ops.engine):
        st = ops.engine[name]
        lines.append(
            f"  engine {name:<15} {st.count:>5} calls  total {st.total_s:8.3f} s  max {st.max_s:7.3f} s"
            + (f"  failures {st.failures}" if st.failures else "")
        )
    calibration = getattr(report, "switch_calibration", None)
    if calibration is not None:
        from dynres.runtime.loop.calibration import CALIBRATION_OPS

        per_op = ", ".join(f"{op} {sum(calibration.durations(op)):.3f} s" for op in CALIBRATION_OPS)
        lines.append(
            f"switch calibration (run.calibration_switches, not counted above): {calibration.rounds} switch "
            f"round trip(s) in {calibration.duration_s:.3f} s before cycle 1: {per_op}"
        )
    return lines


def restarts_line(report: Any) -> str | None:
    """The replicas recreated during the run, in one line (None when none was)."""
    restarts = getattr(report, "replica_restarts", None)
    if not restarts:
        return None
    parts = [
        f"{r.replica} (cycle {r.cycle}) "
        + (
            f"back in {r.seconds_to_return:.1f} s (rebuild {r.rebuild_s or 0:.1f} s, attempts {r.attempts})"
            if r.seconds_to_return is not None
            else "not back"
        )
        for r in restarts
    ]
    return f"replica restarts: {len(restarts)}: {'; '.join(parts)} (causes: report.json replica_restarts)"


def run_summary(report: Any) -> dict[str, float]:
    """A finished run's numbers for the tracking backends' summary (seconds, counts)."""
    s = report.samples
    return {
        "end_to_end_s": float(report.end_to_end_s),
        "cycles": float(len(report.cycles)),
        "samples_generated": float(s.generated),
        "samples_consumed": float(s.consumed),
        "samples_dropped_stale": float(s.dropped_stale),
    }


class MetricsSink:
    """Writes one JSONL record per cycle as cycles finish, and forwards each to the trackers and the display."""

    def __init__(
        self,
        path: Path,
        on_cycle: Callable[[Any, dict[str, Any]], None] | None,
        tracking: TrackerSet | None = None,
        *,
        append: bool = False,
    ) -> None:
        """Open ``path`` for writing (``append``: after its records, for a resumed run); each record
        then goes to ``tracking`` (trainer.logger) and ``on_cycle(cycle, record)``."""
        self.path = path
        self.count = 0
        self._fh = path.open("a" if append else "w", encoding="utf-8")
        self._on_cycle = on_cycle
        self._tracking = tracking

    def __call__(self, cycle: Any) -> None:
        """Write ``cycle``'s record, flushed, and pass it on."""
        rec = cycle.to_record()
        self.write_record(rec)
        if self._on_cycle is not None:
            self._on_cycle(cycle, rec)

    def write_record(self, rec: dict[str, Any]) -> None:
        """Write one record, flushed, and log it to the trackers (a resumed run's recovered record
        goes only here: the display shows the cycles this process runs)."""
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()  # an interrupted run keeps every finished cycle
        self.count += 1
        if self._tracking is not None:
            self._tracking.log_record(rec)

    def close(self) -> None:
        """Close the file (every record written so far stays)."""
        self._fh.close()


def write_config(out_dir: Path, config: Any) -> None:
    """Write ``config.json``: the resolved RunConfig (a pydantic model) the run was started with."""
    (out_dir / CONFIG_FILE).write_text(json.dumps(config.model_dump(mode="json"), indent=2))


def write_backend(out_dir: Path, backend: Mapping[str, Any]) -> None:
    """Write ``backend.json`` (also after a failed or interrupted run)."""
    (out_dir / BACKEND_FILE).write_text(json.dumps(dict(backend), indent=2, default=str))


def write_report(
    out_dir: Path,
    report: Any,
    *,
    plot_dir: Path | None,
    mq_size_cap: int | None = None,
    hybrid_replicas: int | None = None,
) -> None:
    """Write ``report.json`` and, when ``plot_dir`` is given, the plots of ``report`` there."""
    (out_dir / REPORT_FILE).write_text(report.to_json(indent=2))
    if plot_dir is not None:
        from dynres.runtime.plots import write_plots

        write_plots(
            report,
            plot_dir,
            title=f"dynres run [{report.policy}]",
            mq_size_cap=mq_size_cap,
            hybrid_replicas=hybrid_replicas,
        )
