"""Scenario files: validation, did-you-mean, extends, --set overrides, presets as package data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dynres.core.config import parse_set_item
from dynres.core.errors import ConfigError, ScenarioError
from dynres.runtime.sim import presets
from dynres.runtime.sim.scenario import Scenario, load_scenario


def _write(tmp_path: Path, data: object, name: str = "sc.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


def test_required_presets_ship_and_validate() -> None:
    names = presets.preset_names()
    for required in (
        "seed-static-16-16",
        "seed-static-8-24",
        "seed-dynamic-16-16",
        "verl-7b-async-16-16",
        "verl-7b-async-32-32",
        "verl-7b-async-64-64",
        "longcot-dynamic-16-16",
    ):
        assert required in names
    for name in names:
        sc = load_scenario(name)
        assert sc.name == name and sc.description
        sc.dynres_config()


def test_seed_dynamic_preset_matches_the_published_setup() -> None:
    sc = load_scenario("seed-dynamic-16-16")
    at = sc.async_training
    assert (sc.cluster.trainer_gpus, sc.cluster.rollout_gpus) == (16, 16)
    assert at.use_dynamic_resource_scheduling and at.dynamic_schedule_policy == "default"
    assert (at.dynamic_schedule_deactivate_ratio, at.staleness_threshold, at.trigger_parameter_sync_step) == (
        0.6,
        0.5,
        4,
    )
    s824 = load_scenario("seed-static-8-24")
    assert (s824.cluster.trainer_gpus, s824.cluster.rollout_gpus) == (8, 24)
    assert not s824.async_training.use_dynamic_resource_scheduling
    # extends: the baselines share the dynamic preset's workload exactly
    assert s824.workload == sc.workload and s824.costs == sc.costs


def test_preset_files_cite_their_calibration_rows() -> None:
    from importlib import resources

    text = resources.files("dynres.runtime.sim.presets").joinpath("seed-dynamic-16-16.yaml").read_text()
    assert "[M]" in text and "[D]" in text and "[E]" in text


def test_typo_gives_did_you_mean(tmp_path: Path) -> None:
    p = _write(tmp_path, {"extends": "seed-dynamic-16-16", "workload": {"decode": {"peak_tokens_per_sec": 10}}})
    with pytest.raises(ScenarioError, match=r"workload\.decode\.peak_tokens_per_sec.*did you mean 'peak_tokens_per_s'"):
        load_scenario(p)
    with pytest.raises(ScenarioError, match="did you mean 'async_training'"):
        load_scenario({"async_trainig": {}})


def test_out_of_range_and_inconsistent_values(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="staleness_threshold"):
        load_scenario("seed-dynamic-16-16", overrides={"async_training.staleness_threshold": -1})
    with pytest.raises(ScenarioError, match="gpus_per_replica"):
        load_scenario({"cluster": {"trainer_gpus": 6, "rollout_gpus": 8, "gpus_per_replica": 4}})
    with pytest.raises(ScenarioError, match="nothing would generate"):
        load_scenario({"cluster": {"rollout_gpus": 0}})
    with pytest.raises(ScenarioError, match="sum to 1"):
        load_scenario({"workload": {"train": {"phase_fractions": {"update_actor": 0.5}}}})
    with pytest.raises(ScenarioError, match="unknown phase"):
        load_scenario({"workload": {"train": {"phase_fractions": {"update_actr": 1.0}}}})
    with pytest.raises(ScenarioError, match="tensor_model_parallel_size"):
        load_scenario(
            {"actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 2}}, "cluster": {"gpus_per_replica": 1}}
        )


def test_errors_are_config_errors_and_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n", encoding="utf-8")
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="unknown preset 'seed-dynamc-16-16'.*did you mean 'seed-dynamic-16-16'"):
        load_scenario("seed-dynamc-16-16")
    with pytest.raises(ScenarioError, match="top level"):
        load_scenario(_write(tmp_path, [1, 2]))


def test_extends_file_relative_and_cycle(tmp_path: Path) -> None:
    base = _write(tmp_path, {"extends": "seed-dynamic-16-16", "steps": 7}, "base.yaml")
    child = _write(tmp_path, {"extends": base.name, "seed": 3}, "child.yaml")
    sc = load_scenario(child)
    assert (sc.steps, sc.seed, sc.cluster.gpus_per_replica) == (7, 3, 4)
    _write(tmp_path, {"extends": "b.yaml"}, "a.yaml")
    _write(tmp_path, {"extends": "a.yaml"}, "b.yaml")
    with pytest.raises(ScenarioError, match="extends"):
        load_scenario(tmp_path / "a.yaml")


def test_set_overrides_parse_yaml_values() -> None:
    assert parse_set_item("a.b=0.3") == ("a.b", 0.3)
    assert parse_set_item("a=true") == ("a", True)
    assert parse_set_item("a=[1, 2]") == ("a", [1, 2])
    assert parse_set_item("a=text") == ("a", "text")
    with pytest.raises(ConfigError, match="key=value"):
        parse_set_item("novalue")
    with pytest.raises(ConfigError, match=r"--set a.b: value '\[1,' is not valid YAML.*quote the whole value"):
        parse_set_item("a.b=[1,")
    sc = load_scenario("seed-dynamic-16-16", overrides={"async_training.staleness_threshold": 0.3, "steps": 2})
    assert sc.async_training.staleness_threshold == 0.3 and sc.steps == 2
    with pytest.raises(ScenarioError, match="is a value"):
        load_scenario("seed-dynamic-16-16", overrides={"steps.x": 1})


def test_scenario_derived_numbers() -> None:
    sc = Scenario.model_validate({"cluster": {"trainer_gpus": 16, "rollout_gpus": 8, "gpus_per_replica": 4}})
    assert sc.num_standalone_replicas == 2 and sc.num_hybrid_replicas == 0
    cfg = sc.dynres_config()
    assert cfg.trainer.n_gpus == 16 and cfg.rollout.n_gpus == 8
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 4
    assert "16 trainer + 8 rollout GPUs" in sc.summary()
