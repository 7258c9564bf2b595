"""User-facing keys that were renamed, and the one place their old names are still read.

Two kinds of files carry keys a rename must not break. A run file a person wrote: its ``cluster:``
section is now ``ray:`` (``cluster:`` stays the GPU counts of a scenario), its
``run.startup_probe`` is now ``run.calibration_switches`` ("probe" also names a replica's health
probe). And the files of a run an older dynres made, which ``dynres scenario fit`` still reads:
report.json's ``startup_probe`` is now ``switch_calibration``, and config.json has the run file's
old keys. Wherever such a file is read, :func:`upgrade_keys` (and :func:`upgrade_override_keys` for
``--set`` items) moves each old key to its new name and logs one warning line naming the new one.
In a file a person writes, giving both names is an error naming both (which one was meant is not
known); in a file dynres wrote, the new name wins.

Imports only :mod:`dynres.core`, so every layer of the runtime may use it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dynres.core.errors import ConfigError

logger = logging.getLogger("dynres.runtime.renamed_keys")

RENAMED_RUN_KEYS: dict[str, str] = {"cluster": "ray", "run.startup_probe": "run.calibration_switches"}
"""Old dotted key of a run file (and of the config.json a run writes) -> its current name."""

RENAMED_REPORT_KEYS: dict[str, str] = {"startup_probe": "switch_calibration"}
"""Old top-level key of a report.json (``RunReport.to_dict``) -> its current name."""


def upgrade_keys(data: Any, renamed: Mapping[str, str], where: str, *, written_by_dynres: bool = False) -> Any:
    """``data`` with every old key of ``renamed`` under its new name, one warning line per old key.

    ``data`` itself is never changed (the mappings on an old key's path are copied). ``where``
    names the file in the warning and the error. Raises ConfigError when a person's file gives
    both names; ``written_by_dynres``: the new name wins and the old one is dropped.
    """
    if not isinstance(data, Mapping):
        return data
    for old, new in renamed.items():
        parent_path, _, old_leaf = old.rpartition(".")
        new_parent, _, new_leaf = new.rpartition(".")
        if new_parent != parent_path:
            raise ValueError(f"renamed key {old!r} -> {new!r} must keep its section")
        path = parent_path.split(".") if parent_path else []
        parent = _at(data, path)
        if parent is None or old_leaf not in parent:
            continue
        if new_leaf in parent and not written_by_dynres:
            raise ConfigError(
                f"{where}: {old!r} and {new!r} are both given; {old!r} is the deprecated name of {new!r}, "
                f"keep only {new!r}"
            )
        if new_leaf not in parent:
            logger.warning(_warning(where, old, new, written_by_dynres))
        data = _moved(data, path, old_leaf, new_leaf)
    return data


def upgrade_override_keys(overrides: Mapping[str, Any], renamed: Mapping[str, str], where: str) -> dict[str, Any]:
    """Dotted ``--set`` keys with each old key (or a key inside an old section) under its new name.

    One warning line per renamed item; ConfigError when an old key and its new name are both set.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        new_key = key
        for old, new in renamed.items():
            if key == old or key.startswith(old + "."):
                new_key = new + key[len(old) :]
                if new_key in overrides:
                    raise ConfigError(
                        f"{where}: {key!r} and {new_key!r} are both given; {old!r} is the deprecated name of "
                        f"{new!r}, keep only {new_key!r}"
                    )
                logger.warning(_warning(f"{where} {key}", old, new, written_by_dynres=False))
                break
        out[new_key] = value
    return out


def _warning(where: str, old: str, new: str, written_by_dynres: bool) -> str:
    """The one warning line of an old key read as its new name."""
    if written_by_dynres:
        return f"{where}: {old!r} (written by an older dynres) is read as {new!r}"
    return f"{where}: {old!r} is deprecated and read as {new!r}; rename it to {new!r}"


def _at(data: Mapping[str, Any], path: list[str]) -> Mapping[str, Any] | None:
    """The mapping at ``path`` inside ``data``; None when a step is missing or not a mapping."""
    node: Any = data
    for step in path:
        node = node.get(step) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else None


def _moved(data: Mapping[str, Any], path: list[str], old: str, new: str) -> dict[str, Any]:
    """A copy of ``data`` whose mapping at ``path`` has ``old``'s value under ``new`` (an existing ``new`` wins)."""
    out = dict(data)
    if path:
        out[path[0]] = _moved(data[path[0]], path[1:], old, new)
        return out
    value = out.pop(old)
    out.setdefault(new, value)
    return out
