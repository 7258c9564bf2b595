"""``dynres config check FILE``: DynresConfig files and scenario files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dynres.runtime.cli import main


def _check(path: Path) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["config", "check", str(path)])
    return res.exit_code, res.stdout, res.stderr


def _file(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_valid_dynres_config(tmp_path: Path) -> None:
    p = _file(
        tmp_path,
        "async_training:\n  use_dynamic_resource_scheduling: true\n  dynamic_schedule_policy: default\n"
        "trainer: {nnodes: 2, n_gpus_per_node: 8}\nrollout: {nnodes: 2, n_gpus_per_node: 8}\n",
    )
    code, out, err = _check(p)
    assert code == 0, err
    assert out.startswith(f"OK: {p} is a valid dynres config")
    assert "16 trainer GPUs, 16 rollout GPUs" in out and "policy: default" in out


def test_valid_scenario(tmp_path: Path) -> None:
    p = _file(tmp_path, "extends: seed-static-8-24\nsteps: 5\n")
    code, out, err = _check(p)
    assert code == 0, err
    assert "valid simulator scenario" in out and "8 trainer + 24 rollout GPUs" in out and "5 steps" in out


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (
            "async_training: {staleness_treshold: 0.5}\n",
            ("async_training.staleness_treshold", "did you mean 'staleness_threshold'"),
        ),
        (
            "async_training: {trigger_parameter_sync_step: 0}\n",
            ("trigger_parameter_sync_step", "greater than or equal to 1"),
        ),
        ("async_training: {dynamic_schedule_policy: nope}\n", ("unknown policy 'nope'",)),
        (
            "async_training: {dynamic_schedule_policy: default,"
            " dynamic_schedule_policy_params: {ratio_increse_max: 0.2}}\n",
            ("ratio_increse_max", "did you mean 'ratio_increase_max'"),
        ),
        ("steps: 3\ncluster: {trainer_gpus: 4, rollout_gpus: 4, gpus_per_replica: 3}\n", ("gpus_per_replica",)),
        ("steps: 3\nworkload: {respons: {}}\n", ("did you mean 'response'",)),
        ("key: [unclosed\n", ("invalid YAML",)),
    ],
)
def test_invalid_files_one_line_exit_2(tmp_path: Path, text: str, needles: tuple[str, ...]) -> None:
    code, out, err = _check(_file(tmp_path, text))
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("dynres: error:"), err
    for n in needles:
        assert n in lines[0], lines[0]


def test_missing_file(tmp_path: Path) -> None:
    code, _, err = _check(tmp_path / "nope.yaml")
    assert code == 2 and "file not found" in err


def test_policy_from_a_file(tmp_path: Path) -> None:
    pol = _file(
        tmp_path,
        "from dynres.core import Policy\n"
        "class Never(Policy):\n"
        "    name = 'never'\n"
        "    def should_deactivate(self, ctx): return ctx.is_hybrid_active\n"
        "    def deactivate_wait_samples(self, ctx): return 0\n"
        "    def should_activate_after_step(self, ctx): return False\n",
        name="never.py",
    )
    p = _file(tmp_path, f"async_training:\n  dynamic_schedule_policy: {pol}:Never\n")
    code, out, err = _check(p)
    assert code == 0, err
    assert f"policy: never ({pol}:Never)" in out
    p = _file(tmp_path, f"async_training:\n  dynamic_schedule_policy: {pol}:Nevr\n", name="bad.yaml")
    code, _, err = _check(p)
    assert code == 2 and "defines no 'Nevr'" in err


REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["fake-minimal.yaml", "tiny-grpo-cpu.yaml", "tiny-grpo-longtail-cpu.yaml"])
def test_run_files_are_checked_as_run_files(name: str) -> None:
    code, out, err = _check(REPO / "examples" / name)
    assert code == 0, err
    assert "is a valid dynres run file" in out and "policy: default" in out


def test_run_file_typo_is_one_line(tmp_path: Path) -> None:
    text = (REPO / "examples" / "fake-minimal.yaml").read_text().replace("runtime: local", "runtim: local")
    code, _, err = _check(_file(tmp_path, text))
    assert code == 2 and "unknown key 'engines.runtim' (did you mean 'runtime'?)" in err


# ---- A complete verl config ------------------------------------------------------------------------


def test_a_verl_config_is_accepted_and_its_other_keys_named_in_one_line() -> None:
    code, out, err = _check(REPO / "examples" / "verl-fully-async.yaml")
    assert code == 0, err
    assert "is a valid dynres config" in out and "8 standalone + 8 hybrid replicas" in out
    assert "required_samples=32" in out  # ppo_mini_batch_size, a modelled key among verl's
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    # trainer.logger, project_name and experiment_name are modelled (tracking), not ignored
    assert "ignored 24 verl key(s)" in line and "--strict" in line
    for key in ("data", "algorithm", "actor_rollout_ref.actor.optim", "trainer.total_epochs"):
        assert f" {key}," in line or line.endswith(f" {key}"), key


def test_strict_rejects_verl_keys_dynres_does_not_model() -> None:
    res = CliRunner().invoke(main, ["config", "check", "--strict", str(REPO / "examples" / "verl-fully-async.yaml")])
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    # The first problems and a count, not a line of thousands of characters (issue 30, item 6)
    assert line.count("unknown key") == 3 and "and 21 more problem(s)" in line and len(line) < 400


def test_typos_in_a_verl_config_are_still_errors(tmp_path: Path) -> None:
    text = (REPO / "examples" / "verl-fully-async.yaml").read_text()
    code, _, err = _check(_file(tmp_path, text.replace("staleness_threshold", "staleness_treshold")))
    assert code == 2 and "did you mean 'staleness_threshold'" in err
    code, _, err = _check(_file(tmp_path, text.replace("total_epochs", "total_epoks")))
    assert code == 2 and "trainer.total_epoks" in err  # not verl's key either


def test_a_verl_config_around_a_run_file(tmp_path: Path) -> None:
    run = (REPO / "examples" / "fake-minimal.yaml").read_text()
    extra = "data:\n  train_files: x.parquet\nalgorithm:\n  adv_estimator: grpo\n"
    code, out, err = _check(_file(tmp_path, run + extra))
    assert code == 0, err
    assert "is a valid dynres run file" in out and "ignored 2 verl key(s)" in err


def test_config_schema_is_the_models_json_schema() -> None:
    from dynres.core.config import DynresConfig
    from dynres.runtime.realrun.config import RunConfig
    from dynres.runtime.sim.scenario import Scenario

    for kind, model in (("config", DynresConfig), ("run", RunConfig), ("scenario", Scenario)):
        res = CliRunner().invoke(main, ["config", "schema", kind, "--strict"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout) == model.model_json_schema()


def test_config_schema_accepts_what_config_check_accepts() -> None:
    """Without --strict the schema takes a complete verl config, as `config check` does (issue 30, item 6)."""
    import jsonschema
    import yaml

    verl = yaml.safe_load((REPO / "examples" / "verl-fully-async.yaml").read_text())
    open_schema = json.loads(CliRunner().invoke(main, ["config", "schema", "config"]).stdout)
    jsonschema.validate(verl, open_schema)
    strict = json.loads(CliRunner().invoke(main, ["config", "schema", "config", "--strict"]).stdout)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(verl, strict)
    typo = {**verl, "async_training": {**verl["async_training"], "staleness_threshold": "high"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(typo, open_schema)  # modelled keys keep their types
    scenario = json.loads(CliRunner().invoke(main, ["config", "schema", "scenario"]).stdout)
    assert scenario["additionalProperties"] is False  # scenarios are never verl files


def test_config_reference_page_matches_the_models() -> None:
    """docs/config-reference.md is what `dynres config schema --markdown` prints (regenerate it if not)."""
    from dynres.runtime.cli.reference import reference_markdown

    page = Path(__file__).resolve().parents[3] / "docs" / "config-reference.md"
    if not page.is_file():
        pytest.skip("docs/ is only in a checkout of the repository")
    assert page.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/config-reference.md is stale: run `dynres config schema --markdown > docs/config-reference.md`"
    )
    text = reference_markdown()
    for key in ("async_training.staleness_threshold", "engines.rollout", "workload.decode.peak_tokens_per_s"):
        assert f"`{key}`" in text, key
