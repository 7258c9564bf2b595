"""The ``console`` tracking backend: one line per sync cycle on stderr (verl's ``console`` logger).

The line names the cycle, its wall time (simulated seconds under ``dynres simulate``), which
hybrid transitions it made (``A`` activated, ``D`` deactivated), the cluster utilization, the
queue size and the mean reward when the trainer reports one. Under ``dynres simulate`` each line
starts with the run's ``scenario[policy]`` label. A rich progress display on the terminal keeps
the lines above its bars (rich redirects stderr while it draws).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from dynres.core.hookspecs import hookimpl
from dynres.core.metrics import CLUSTER_UTILIZATION, MQ_SIZE, TRACKING_NAMES, reward_key
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend

CYCLE_TIME = TRACKING_NAMES["duration_s"]
"""The tracking name of a cycle's wall time (seconds)."""


def cycle_line(metrics: Mapping[str, float], step: int, total: int) -> str:
    """``cycle   3/12   1.23 s  hybrid AD  util 0.82  mq 12  reward 0.500`` from one cycle's tracked metrics."""
    hybrid = ("A" if metrics.get("dynres/activated") else "-") + ("D" if metrics.get("dynres/deactivated") else "-")
    rk = reward_key(metrics)
    reward = f"  reward {metrics[rk]:.3f}" if rk else ""
    of = f"/{total}" if total else ""
    return (
        f"cycle {step:>3}{of} {metrics.get(CYCLE_TIME, 0.0):6.2f} s  hybrid {hybrid}  "
        f"util {metrics.get(CLUSTER_UTILIZATION, 0.0):.2f}  mq {int(metrics.get(MQ_SIZE, 0.0))}{reward}"
    )


class ConsoleTracker(Tracker):
    """Prints :func:`cycle_line` for each cycle of one run on stderr."""

    def __init__(self, run: TrackedRun) -> None:
        """Print the lines of ``run`` (labelled with its name under ``dynres simulate``)."""
        self.run = run
        self.prefix = f"{run.name}: " if run.kind == "simulate" else ""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print the cycle's line (flushed, so a pipe sees it at once)."""
        print(self.prefix + cycle_line(metrics, step, self.run.total_steps), file=sys.stderr, flush=True)


class ConsoleBackend(TrackingBackend):
    """verl's ``console``: a line per cycle on stderr; needs nothing, writes no file."""

    name = "console"
    writes_files = False
    summary = "one line per sync cycle on stderr"

    def open(self, run: TrackedRun) -> Tracker:
        """A :class:`ConsoleTracker` for ``run``."""
        return ConsoleTracker(run)


@hookimpl
def dynres_tracking_backends() -> list[TrackingBackend]:
    """Offer the ``console`` backend."""
    return [ConsoleBackend()]
