"""``dynres policies list``."""

from __future__ import annotations

import json

from click.testing import CliRunner

from dynres.runtime.cli import main


def test_policies_list_table() -> None:
    res = CliRunner().invoke(main, ["policies", "list"])
    assert res.exit_code == 0, res.output
    for name in ("default", "static_fully_async", "fixed_ratio", "dynres-policies", "0.1.0"):
        assert name in res.stdout


def test_policies_list_json() -> None:
    res = CliRunner().invoke(main, ["policies", "list", "--json"])
    assert res.exit_code == 0
    rows = json.loads(res.stdout)
    by_name = {r["name"]: r for r in rows}
    assert by_name["default"]["distribution"] == "dynres-policies"
    assert by_name["default"]["value"] == "dynres.policies.default:DefaultPolicy"


def test_help_and_version() -> None:
    res = CliRunner().invoke(main, ["--help"])
    assert res.exit_code == 0 and "simulate" in res.stdout and "policies" in res.stdout and "config" in res.stdout
    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0 and "0.1.0" in res.stdout


def test_policies_list_marks_a_broken_entry_point(monkeypatch) -> None:
    import dynres.core
    from dynres.core.loading import PolicyEntry

    real = dynres.core.installed_policies()
    broken = PolicyEntry(name="broken", value="no_such_module_xyz:Nope", distribution="bad-dist", version="0.0.1")
    monkeypatch.setattr(dynres.core, "installed_policies", lambda: {**real, "broken": [broken]})
    res = CliRunner().invoke(main, ["policies", "list", "--json"])
    by_name = {r["name"]: r for r in json.loads(res.stdout)}
    assert by_name["default"]["error"] is None
    assert "failed to import" in by_name["broken"]["error"] and "bad-dist" in by_name["broken"]["error"]
    res = CliRunner().invoke(main, ["policies", "list"])
    assert res.exit_code == 0 and "BROKEN" in res.stdout
