"""A scenario mapping whose every value carries the note of where it came from, written as YAML.

A fitted scenario is only as useful as the reader's trust in each number, so the fit never
writes a bare value: :meth:`AnnotatedScenario.set` stores the value with its note (tag, source,
how many values it rests on), and :meth:`AnnotatedScenario.default` stores a scenario default
with the metric whose absence forced it, and lists that metric at the top of the file.
:func:`scenario_yaml` writes the mapping with each note as the key's end-of-line comment, so
``dynres simulate`` loads the same file the reader audits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dynres.runtime.sim.scenario import Scenario

NOTE_COLUMN = 44
"""Column the end-of-line notes start at (characters), so the notes of a section line up."""


class AnnotatedScenario:
    """A scenario mapping under construction: each dotted key's value with a note of its source,
    and one line per metric the run lacked (the key and the default used)."""

    def __init__(self) -> None:
        self.raw: dict[str, Any] = {}
        """The scenario mapping, sections nested as in a scenario YAML, keys in the order set."""
        self.notes: dict[str, str] = {}
        """Dotted key -> where its value came from and how well it is determined."""
        self.missing: list[str] = []
        """One line per needed metric the run lacked: ``metric -> key = default``."""

    def set(self, dotted: str, value: Any, note: str) -> None:
        """Set ``dotted`` (``section.key``) to ``value``, noting where it came from."""
        node = self.raw
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        self.notes[dotted] = note

    def default(self, dotted: str, metric: str, *, listed: bool = True) -> Any:
        """Use the scenario's default for ``dotted`` because ``metric`` is missing; return it.

        ``listed``: also name it in :attr:`missing` (False when the caller reports it otherwise).
        """
        value: Any = Scenario()
        for part in dotted.split("."):
            value = value[part] if isinstance(value, Mapping) else getattr(value, part)
        if hasattr(value, "model_dump"):
            value = value.model_dump()
        self.set(dotted, value, f"DEFAULT: missing {metric}")
        if listed:
            self.missing.append(f"{metric} -> {dotted} = {yaml_scalar(value)}")
        return value

    def get(self, dotted: str) -> Any:
        """The value set for ``dotted`` (KeyError when it was not set)."""
        node: Any = self.raw
        for part in dotted.split("."):
            node = node[part]
        return node

    def unlist(self, dotted: str) -> None:
        """Drop the missing-metric lines of ``dotted``: a later section determined it after all."""
        self.missing[:] = [m for m in self.missing if dotted not in m]


def yaml_scalar(v: Any) -> str:
    """``v`` as one line of YAML (floats to 6 significant digits, mappings in flow style)."""
    import yaml

    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else ".nan"
    if isinstance(v, Mapping):
        return yaml.safe_dump(dict(v), default_flow_style=True, width=1000).strip()
    return yaml.safe_dump(v, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


def scenario_yaml(scenario: Mapping[str, Any], notes: Mapping[str, str], header: list[str], missing: list[str]) -> str:
    """The scenario as commented YAML: the header and missing metrics as comments, then each key
    with its note at the end of its line."""
    lines = [f"# {h}" for h in header]
    if missing:
        lines.append("# Missing from the metrics (defaults used):")
        lines += [f"#   - {m}" for m in missing]
    lines.append("")
    _emit(scenario, "", 0, notes, lines)
    return "\n".join(lines) + "\n"


def _emit(node: Mapping[str, Any], prefix: str, indent: int, notes: Mapping[str, str], out: list[str]) -> None:
    """Append the lines of ``node``; a mapping noted as a whole (no note below it) is one flow line."""
    pad = "  " * indent
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        note = notes.get(dotted)
        leaf = not isinstance(value, Mapping) or (
            dotted in notes and not any(k.startswith(dotted + ".") for k in notes)
        )
        if leaf:
            text = f"{pad}{key}: {yaml_scalar(value)}"
            out.append(f"{text:<{NOTE_COLUMN}}  # {note}" if note else text)
        else:
            out.append(f"{pad}{key}:" + (f"  # {note}" if note else ""))
            _emit(value, dotted + ".", indent + 1, notes, out)
