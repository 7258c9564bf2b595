"""docs/policy-api.md keeps up with core: every hook spec and every ScheduleContext field has a row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynres.core import ScheduleContext
from dynres.core.hookspecs import DECISION_HOOKS, OBSERVER_HOOKS, RESOLUTION_HOOKS

POLICY_API = Path(__file__).resolve().parents[3] / "docs" / "policy-api.md"

pytestmark = pytest.mark.skipif(not POLICY_API.is_file(), reason="docs/ is only in a checkout of the repository")


def table_keys(text: str) -> set[str]:
    """Names in the first column of markdown tables, written as `name`."""
    return set(re.findall(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`", text, flags=re.MULTILINE))


def test_every_hook_spec_is_documented() -> None:
    documented = table_keys(POLICY_API.read_text(encoding="utf-8"))
    missing = [h for h in DECISION_HOOKS + OBSERVER_HOOKS + RESOLUTION_HOOKS if h not in documented]
    assert not missing, f"docs/policy-api.md has no table row for hook(s) {missing}"


def test_every_context_field_is_documented() -> None:
    documented = table_keys(POLICY_API.read_text(encoding="utf-8"))
    fields = [*ScheduleContext.model_fields, *ScheduleContext.model_computed_fields, "surplus_samples"]
    missing = [f for f in fields if f not in documented]
    assert not missing, f"docs/policy-api.md has no table row for ScheduleContext field(s) {missing}"


def test_the_doc_test_notices_a_missing_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checks above must be able to fail: pretend the context gained a field.
    fields = dict(ScheduleContext.model_fields)
    fields["brand_new_field"] = fields["now"]
    monkeypatch.setattr(ScheduleContext, "model_fields", fields, raising=False)
    with pytest.raises(AssertionError, match="brand_new_field"):
        test_every_context_field_is_documented()


def test_the_doc_test_notices_a_missing_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.OBSERVER_HOOKS", (*OBSERVER_HOOKS, "dynres_brand_new_hook"))
    with pytest.raises(AssertionError, match="dynres_brand_new_hook"):
        test_every_hook_spec_is_documented()
