"""docs/builtin-policies.md keeps up with the built-ins: a section per policy, a row per param."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynres.core import installed_policies, resolve_policy_class

DOC = Path(__file__).resolve().parents[3] / "docs" / "builtin-policies.md"

pytestmark = pytest.mark.skipif(not DOC.is_file(), reason="docs/ is only in a checkout of the repository")


def _builtins() -> list[str]:
    return [name for name, entries in installed_policies().items() if entries[0].distribution == "dynres-policies"]


def _table_keys(text: str) -> set[str]:
    """Names in the first column of markdown tables, written as `name`."""
    return set(re.findall(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`", text, flags=re.MULTILINE))


def test_the_builtins_are_the_four_expected() -> None:
    assert sorted(_builtins()) == ["default", "fixed_ratio", "predictive", "static_fully_async"]


@pytest.mark.parametrize("name", _builtins())
def test_every_builtin_policy_and_param_is_documented(name: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert re.search(rf"^## `{name}`", text, flags=re.MULTILINE), f"no '## `{name}`' section"
    section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
    params = resolve_policy_class(name).Params.model_fields
    missing = [p for p in params if p not in _table_keys(section)]
    assert not missing, f"docs/builtin-policies.md, section {name}: no table row for param(s) {missing}"
