"""Run folders: where ``dynres run`` (and ``dynres simulate``'s tracking) write when no folder is given.

The default is ``dynres-runs/<name>`` in the working directory. A default folder never replaces
an earlier run: when ``<name>`` holds files, the next free ``<name>-2``, ``<name>-3``, ... is
taken. ``dynres-runs/`` gets a ``.gitignore`` that ignores everything in it, so run outputs never
end up in a commit of the project they were started from. A folder named with ``--out`` is used
as given (an earlier run's files there are replaced, which the CLI says in one line).
"""

from __future__ import annotations

from pathlib import Path

OUT_ROOT = Path("dynres-runs")
"""Parent of the default run folders (relative to the working directory)."""
GITIGNORE_TEXT = "# Written by dynres: run folders are outputs, never sources.\n*\n"
"""What ``dynres-runs/.gitignore`` holds."""
RUN_MARKERS = ("metrics.jsonl", "report.json", "config.json", "tensorboard", "mlruns", "wandb", "file")
"""Entries that show a folder holds an earlier run."""


def holds_run(folder: Path) -> bool:
    """True when ``folder`` holds the files of an earlier run."""
    return any((folder / name).exists() for name in RUN_MARKERS)


def default_out_dir(name: str, root: Path = OUT_ROOT) -> Path:
    """``root/name``, or the first of ``root/name-2``, ``-3``, ... that does not exist or is empty."""
    candidate, n = root / name, 1
    while candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
        n += 1
        candidate = root / f"{name}-{n}"
    return candidate


def ignore_in_git(root: Path = OUT_ROOT) -> None:
    """Write ``root/.gitignore`` (ignore everything) unless one is there; best effort, never an error."""
    marker = root / ".gitignore"
    try:
        if root.is_dir() and not marker.exists():
            marker.write_text(GITIGNORE_TEXT, encoding="utf-8")
    except OSError:
        pass  # a read-only folder still holds the run; git hygiene is a courtesy
