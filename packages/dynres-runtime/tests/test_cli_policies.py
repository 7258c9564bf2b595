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
    assert by_name["default"]["import_path"] == "dynres.policies.default:DefaultPolicy"


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


def test_policies_list_json_to_a_file(tmp_path) -> None:
    dest = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["policies", "list", "--json", str(dest)])
    assert res.exit_code == 0
    assert {r["name"] for r in json.loads(dest.read_text())} >= {"default", "fixed_ratio", "static_fully_async"}
    assert "installed dynres policies" in res.stdout  # the table still goes to stdout


def test_policies_show_params_defaults_units_and_docs() -> None:
    # Wide enough that the description cell does not wrap (pytest-xdist workers set COLUMNS=80).
    res = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["policies", "show", "fixed_ratio"])
    assert res.exit_code == 0, res.output
    assert "dynres.policies.fixed_ratio:FixedRatioPolicy" in res.stdout
    assert "deactivate_ratio" in res.stdout and "0.3" in res.stdout and ">= 0.0" in res.stdout
    assert "fraction of a cycle's samples" in " ".join(res.stdout.split())
    info = json.loads(CliRunner().invoke(main, ["policies", "show", "default", "--json"]).stdout)
    assert info["distribution"] == "dynres-policies" and info["doc"].startswith("Adapt")
    by_name = {p["name"]: p for p in info["params"]}
    from dynres.policies.default import DefaultPolicy

    assert set(by_name) == set(DefaultPolicy.Params.model_fields)
    assert all(p["description"] for p in info["params"])


def test_policies_show_unknown_name_is_one_line() -> None:
    res = CliRunner().invoke(main, ["policies", "show", "defualt"])
    assert res.exit_code == 2 and "did you mean 'default'" in res.stderr and "Traceback" not in res.output


def test_version_and_short_help_not_truncated() -> None:
    res = CliRunner().invoke(main, ["-V"])
    assert res.exit_code == 0 and "0.1.0" in res.stdout
    res = CliRunner().invoke(main, ["--help"], terminal_width=200)
    commands = res.stdout.split("Commands:")[1]
    assert "..." not in commands, commands
    for name, cmd in main.commands.items():
        assert cmd.short_help and " ".join(cmd.short_help.split()) in " ".join(commands.split()), name


def test_completion_of_presets_and_policies() -> None:
    from click.shell_completion import ShellComplete

    def complete(args: list[str], incomplete: str) -> list[str]:
        return [
            c.value for c in ShellComplete(main, {}, "dynres", "_DYNRES_COMPLETE").get_completions(args, incomplete)
        ]

    assert "seed-dynamic-16-16" in complete(["simulate", "--preset"], "seed-d")
    assert "fixed_ratio" in complete(["simulate", "--compare-policy"], "fix")
    assert complete(["policies", "show"], "stat") == ["static_fully_async"]
