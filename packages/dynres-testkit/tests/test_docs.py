"""The docs keep up with the code: every hook, context field, built-in param and check is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynres.core import ScheduleContext, installed_policies, resolve_policy_class
from dynres.core.hookspecs import DECISION_HOOKS, OBSERVER_HOOKS
from dynres.testkit.checks import all_checks

DOCS = Path(__file__).resolve().parents[3] / "docs"
MINE = [
    "index.md",
    "installing.md",
    "policy-api.md",
    "writing-a-policy.md",
    "testing-a-policy.md",
    "builtin-policies.md",
]

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is only in a checkout of the repository")


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _table_keys(text: str) -> set[str]:
    """Names in the first column of markdown tables, written as `name`."""
    return set(re.findall(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`", text, flags=re.MULTILINE))


@pytest.mark.parametrize("name", MINE)
def test_doc_exists_and_links_resolve(name: str) -> None:
    text = _text(name)
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).is_file(), f"{name} links to {target}, which does not exist"


def test_every_hook_spec_is_documented() -> None:
    documented = _table_keys(_text("policy-api.md"))
    missing = [h for h in DECISION_HOOKS + OBSERVER_HOOKS if h not in documented]
    assert not missing, f"docs/policy-api.md has no table row for hook(s) {missing}"


def test_every_context_field_is_documented() -> None:
    documented = _table_keys(_text("policy-api.md"))
    fields = [*ScheduleContext.model_fields, *ScheduleContext.model_computed_fields, "surplus_samples"]
    missing = [f for f in fields if f not in documented]
    assert not missing, f"docs/policy-api.md has no table row for ScheduleContext field(s) {missing}"


def _builtins() -> list[str]:
    return [name for name, entries in installed_policies().items() if entries[0].distribution == "dynres-policies"]


def test_the_builtins_are_the_three_expected() -> None:
    assert sorted(_builtins()) == ["default", "fixed_ratio", "static_fully_async"]


@pytest.mark.parametrize("name", _builtins())
def test_every_builtin_policy_and_param_is_documented(name: str) -> None:
    text = _text("builtin-policies.md")
    assert re.search(rf"^## `{name}`", text, flags=re.MULTILINE), f"no '## `{name}`' section"
    section = text.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
    params = resolve_policy_class(name).Params.model_fields
    missing = [p for p in params if p not in _table_keys(section)]
    assert not missing, f"docs/builtin-policies.md, section {name}: no table row for param(s) {missing}"


def test_every_check_is_documented() -> None:
    documented = _table_keys(_text("testing-a-policy.md"))
    missing = [c.__name__ for c in all_checks() if c.__name__ not in documented]
    assert not missing, f"docs/testing-a-policy.md has no table row for check(s) {missing}"


def test_the_doc_test_notices_a_missing_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checks above must be able to fail: pretend the context gained a field.
    fields = dict(ScheduleContext.model_fields)
    fields["brand_new_field"] = fields["now"]
    monkeypatch.setattr(ScheduleContext, "model_fields", fields, raising=False)
    with pytest.raises(AssertionError, match="brand_new_field"):
        test_every_context_field_is_documented()
