"""Scenario presets shipped with dynres-runtime: one YAML file per preset in this directory.

Each file is a scenario (see :mod:`dynres.runtime.sim.scenario`); every calibrated number carries
a comment naming the row of ``calibration.md`` it comes from ([M] measured, [D] derived, [E]
estimated).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from dynres.core.errors import ScenarioError, did_you_mean


@functools.cache
def _files() -> dict[str, Any]:
    root = resources.files(__name__)
    return {
        entry.name.rsplit(".", 1)[0]: entry
        for entry in root.iterdir()
        if entry.name.endswith(".yaml") and not entry.name.startswith("_")
    }


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(_files())


def is_preset(name: str) -> bool:
    """True when ``name`` is a shipped preset."""
    return name in _files()


def preset_raw(name: str) -> dict[str, Any]:
    """The preset's raw YAML mapping (``extends`` unresolved); ScenarioError for unknown names."""
    files = _files()
    if name not in files:
        raise ScenarioError(
            f"unknown preset {name!r}{did_you_mean(name, files)}; available presets: "
            f"{', '.join(sorted(files))} (or pass a scenario YAML file)"
        )
    data = yaml.safe_load(files[name].read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ScenarioError(f"preset {name!r} is not a mapping; the installed package is damaged")
    return data


def preset_description(name: str) -> str:
    """The preset's one-line description."""
    return str(preset_raw(name).get("description", "")).strip()
