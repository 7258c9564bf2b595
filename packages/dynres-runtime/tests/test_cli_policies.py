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
