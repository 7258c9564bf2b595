"""Reading a run's per-cycle metrics for ``dynres scenario fit``: dynres's JSONL or verl's file logger.

Two formats, told apart by the first record:

* **dynres** (``dynres run``'s ``metrics.jsonl``): one flat record per sync cycle,
  :meth:`dynres.runtime.loop.report.CycleReport.to_record` (``step``, ``start_s``, ``duration_s``,
  ``dynamic_resource/*``, ``batch/*``, ...). The files ``dynres run`` writes next to it are read
  when present: ``config.json`` (the resolved run config) and ``report.json`` (engine operation
  timings, end-to-end time, the policy). Keys an older dynres wrote under their old names are read
  under the new ones (:mod:`dynres.runtime.renamed_keys`).
* **verl** (verl's ``file`` logger backend, ``trainer.logger=[..., file]``): one line per
  ``logger.log`` call, ``{"step": <param version>, "data": {<metric>: <value>}}``. The
  fully-async trainer logs twice per sync cycle under the same step (the rollouter's timings,
  then the cycle's aggregated training metrics); lines of one step are merged into one record,
  and only steps with a training time (``timing_s/step`` or ``perf/time_per_step``) are cycles.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.core.errors import MetricsError
from dynres.runtime.renamed_keys import RENAMED_REPORT_KEYS, RENAMED_RUN_KEYS, upgrade_keys

DYNRES = "dynres"
"""Format name of ``dynres run``'s metrics.jsonl."""
VERL = "verl"
"""Format name of verl's file-logger JSONL."""

VERL_CYCLE_KEYS: tuple[str, ...] = ("timing_s/step", "perf/time_per_step")
"""A verl record with one of these keys is a training sync cycle (seconds)."""
DYNRES_REQUIRED_KEYS: tuple[str, ...] = ("step", "start_s", "end_s", "duration_s", "samples_consumed")
"""Keys every dynres per-cycle record has."""


@dataclass
class RunMetrics:
    """One run's per-cycle records, in step order, with what was found next to them."""

    path: Path
    """The JSONL file read."""
    format: str
    """``dynres`` or ``verl``."""
    cycles: list[dict[str, Any]]
    """One flat record per sync cycle, in step order (verl: the lines of one step merged)."""
    config: dict[str, Any] | None = None
    """The run's config mapping (dynres ``config.json`` or a ``--config`` file); None = not found."""
    config_source: str = ""
    """Where :attr:`config` came from (a path), '' when there is none."""
    report: dict[str, Any] | None = None
    """dynres ``report.json`` next to the metrics; None = not found (always None for verl)."""
    skipped_lines: list[int] = field(default_factory=list)
    """Line numbers (1-based) of verl lines that are not training cycles (validation, start-up)."""

    def series(self, key: str) -> list[float]:
        """The finite numeric values of ``key`` over the cycles that have it, in order."""
        out = []
        for rec in self.cycles:
            v = rec.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if math.isfinite(v):
                out.append(float(v))
        return out

    def has(self, key: str) -> bool:
        """True when at least one cycle has a finite number under ``key``."""
        return bool(self.series(key))

    def first(self, *keys: str) -> tuple[str, list[float]] | None:
        """The first of ``keys`` that some cycle has, with its :meth:`series`; None when none has.

        For a metric logged under more than one name (verl: timing_s/step or perf/time_per_step)."""
        for key in keys:
            values = self.series(key)
            if values:
                return key, values
        return None


def _load_lines(path: Path, what: str) -> list[tuple[int, Any]]:
    if not path.exists():
        raise MetricsError(
            f"{what} {path}: no such file; give the metrics.jsonl of a `dynres run --out DIR` "
            "(DIR/metrics.jsonl) or the JSONL verl's file logger wrote (VERL_FILE_LOGGER_PATH)"
        )
    if path.is_dir():
        inner = path / "metrics.jsonl"
        if inner.exists():
            path = inner
        else:
            raise MetricsError(f"{what} {path}: is a directory without metrics.jsonl; give the JSONL file itself")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricsError(f"{what} {path}: cannot read it ({exc}); give a readable UTF-8 JSONL file") from None
    rows = []
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((no, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise MetricsError(
                f"{what} {path}, line {no}: not JSON ({exc.msg}); the file must hold one JSON "
                "object per line (a `dynres run` metrics.jsonl or verl's file-logger output)"
            ) from None
    if not rows:
        raise MetricsError(
            f"{what} {path}: the file is empty; the run wrote no cycle yet, let it finish at least 2 sync cycles"
        )
    return rows


def read_report(path: str | Path, *, what: str = "report") -> tuple[dict[str, Any], str]:
    """A dynres ``report.json`` (or the one in a ``dynres run --out`` directory) and its path.

    Raises MetricsError naming the file when it is missing, not JSON or has no engine timings.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MetricsError(
            f"{what} {p}: no such file; give a `dynres run --out` directory or its report.json"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MetricsError(f"{what} {p}: not a readable JSON report ({exc}); give a dynres run's report.json") from None
    if not isinstance(data, dict) or not isinstance((data.get("operations") or {}).get("engine"), dict):
        raise MetricsError(f"{what} {p}: no operations.engine timings; give the report.json a `dynres run` wrote")
    return upgrade_keys(data, RENAMED_REPORT_KEYS, f"{what} {p}", written_by_dynres=True), str(p)


def detect_format(first: Any) -> str | None:
    """``dynres``, ``verl`` or None for a first record of neither format."""
    if not isinstance(first, dict):
        return None
    if isinstance(first.get("data"), dict) and "step" in first:
        return VERL
    if all(k in first for k in DYNRES_REQUIRED_KEYS):
        return DYNRES
    return None


def read_metrics(path: str | Path, *, what: str = "metrics") -> RunMetrics:
    """Read a run's per-cycle metrics (either format) and the files ``dynres run`` writes next to them.

    Raises MetricsError naming the file (and line) for a missing, empty, non-JSON or unknown-format
    file, or one without a single training cycle.
    """
    p = Path(path)
    rows = _load_lines(p, what)
    if p.is_dir():
        p = p / "metrics.jsonl"
    fmt = detect_format(rows[0][1])
    if fmt is None:
        keys = sorted(rows[0][1])[:6] if isinstance(rows[0][1], dict) else type(rows[0][1]).__name__
        raise MetricsError(
            f"{what} {p}, line {rows[0][0]}: neither a `dynres run` record (needs "
            f"{', '.join(DYNRES_REQUIRED_KEYS)}) nor a verl file-logger line "
            f'({{"step": N, "data": {{...}}}}); got {keys}; give metrics.jsonl of `dynres run` '
            "or verl's file-logger JSONL"
        )
    return _dynres_run(p, rows, what) if fmt == DYNRES else _verl_run(p, rows, what)


def _dynres_run(p: Path, rows: list[tuple[int, Any]], what: str) -> RunMetrics:
    """The records of a dynres metrics.jsonl in step order, with config.json and report.json next to it."""
    cycles = []
    for no, rec in rows:
        if not isinstance(rec, dict) or any(k not in rec for k in DYNRES_REQUIRED_KEYS):
            raise MetricsError(
                f"{what} {p}, line {no}: not a `dynres run` cycle record (missing "
                f"{[k for k in DYNRES_REQUIRED_KEYS if not isinstance(rec, dict) or k not in rec]}); "
                "the file mixes formats or was cut; keep only whole records"
            )
        cycles.append(rec)
    cycles.sort(key=lambda r: r["step"])
    run = RunMetrics(path=p, format=DYNRES, cycles=cycles)
    for name, attr, renamed in (
        ("config.json", "config", RENAMED_RUN_KEYS),
        ("report.json", "report", RENAMED_REPORT_KEYS),
    ):
        side = p.parent / name
        if side.exists():
            try:
                data = json.loads(side.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue  # a damaged side file only costs what it would have told
            setattr(run, attr, upgrade_keys(data, renamed, str(side), written_by_dynres=True))
            if attr == "config":
                run.config_source = str(side)
    return run


def _verl_run(p: Path, rows: list[tuple[int, Any]], what: str) -> RunMetrics:
    """The training cycles of verl's file-logger lines: the lines of one step merged, steps
    without a training time (validation, start-up) skipped."""
    merged: dict[int, dict[str, Any]] = {}
    first_line: dict[int, int] = {}
    for no, rec in rows:
        if not (isinstance(rec, dict) and isinstance(rec.get("data"), dict) and isinstance(rec.get("step"), int)):
            raise MetricsError(
                f'{what} {p}, line {no}: not a verl file-logger line ({{"step": N, "data": {{...}}}}); '
                "the file mixes formats or was cut; keep only whole lines"
            )
        merged.setdefault(rec["step"], {}).update(rec["data"])
        first_line.setdefault(rec["step"], no)
    cycles = []
    skipped = []
    for step in sorted(merged):
        data = merged[step]
        if any(k in data for k in VERL_CYCLE_KEYS):
            cycles.append({"step": step, **data})
        else:
            skipped.append(first_line[step])
    if not cycles:
        raise MetricsError(
            f"{what} {p}: verl lines but no training cycle (no {' or '.join(VERL_CYCLE_KEYS)} in any "
            "step); log the fully-async trainer's metrics with trainer.logger including 'file'"
        )
    return RunMetrics(path=p, format=VERL, cycles=cycles, skipped_lines=skipped)
