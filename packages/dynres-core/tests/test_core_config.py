"""DynresConfig: verl defaults, typo and range errors, only-hybrid rules, YAML loading."""

from __future__ import annotations

import pytest
from pydantic import Field

from dynres.core import AsyncTrainingConfig, DynresConfig, Policy, load_config
from dynres.core.config import policy_params_from_config, read_yaml, validate_model
from dynres.core.errors import ConfigError, DynresError


def test_async_training_defaults_equal_verl():
    cfg = DynresConfig().async_training
    assert cfg.staleness_threshold == 0.1
    assert cfg.trigger_parameter_sync_step == 4
    assert cfg.require_batches == 1
    assert cfg.dynamic_schedule_deactivate_ratio == 0.3
    assert cfg.dynamic_schedule_enable_rebalance is True
    assert cfg.dynamic_schedule_policy == "default"
    assert cfg.use_dynamic_resource_scheduling is False
    assert cfg.partial_rollout is True


def test_verl_keys_are_accepted_unchanged():
    cfg = load_config(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "dynamic_schedule_policy": "fixed_ratio",
                "dynamic_schedule_deactivate_ratio": 0.5,
                "dynamic_schedule_enable_rebalance": False,
                "staleness_threshold": 0.3,
                "trigger_parameter_sync_step": 2,
                "require_batches": 3,
                "partial_rollout": False,
                "concurrent_samples_per_replica": 8,
            },
            "actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": 16},
                "rollout": {
                    "gpu_memory_utilization": 0.4,
                    "standalone_gpu_memory_utilization": 0.8,
                    "tensor_model_parallel_size": 2,
                    "n": 8,
                },
            },
            "rollout": {"nnodes": 3, "n_gpus_per_node": 8},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 8},
        }
    )
    assert cfg.required_samples == 48
    assert cfg.num_standalone_replicas == 12
    assert cfg.num_hybrid_replicas == 4
    assert cfg.only_hybrid is False


def test_no_hybrid_replicas_without_dynamic_scheduling():
    assert DynresConfig().num_hybrid_replicas == 0
    on = load_config({"async_training": {"use_dynamic_resource_scheduling": True}})
    assert on.num_hybrid_replicas == 8


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"async_training": {"stalenes_threshold": 0.2}},
            "unknown key 'async_training.stalenes_threshold' (did you mean 'staleness_threshold'?)",
        ),
        (
            {"actor_rollout_ref": {"rollout": {"gpu_memory_utilisation": 0.5}}},
            "unknown key 'actor_rollout_ref.rollout.gpu_memory_utilisation' (did you mean 'gpu_memory_utilization'?)",
        ),
        ({"asynctraining": {}}, "unknown key 'asynctraining' (did you mean 'async_training'?)"),
        ({"trainer": {"nnode": 2}}, "unknown key 'trainer.nnode' (did you mean 'nnodes'?)"),
    ],
)
def test_typo_names_the_key_path_and_suggests(data, expected):
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert expected in str(info.value)


def test_far_off_key_lists_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        load_config({"trainer": {"zzzzzz": 1}})
    assert "unknown key 'trainer.zzzzzz'; valid keys here: nnodes, n_gpus_per_node" in str(info.value)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("async_training", "staleness_threshold", -0.1),
        ("async_training", "trigger_parameter_sync_step", 0),
        ("async_training", "require_batches", 0),
        ("async_training", "dynamic_schedule_deactivate_ratio", 1.5),
        ("async_training", "dynamic_schedule_deactivate_ratio", -0.01),
        ("async_training", "concurrent_samples_per_replica", 0),
        ("async_training", "dynamic_schedule_policy", ""),
        ("rollout", "nnodes", -1),
        ("rollout", "n_gpus_per_node", 0),
    ],
)
def test_out_of_range_values_are_named(section, key, value):
    with pytest.raises(ConfigError) as info:
        load_config({section: {key: value}})
    msg = str(info.value)
    assert msg.startswith("config: ")
    assert f"{section}.{key}:" in msg and f"(got {value!r})" in msg


@pytest.mark.parametrize("key", ["gpu_memory_utilization", "standalone_gpu_memory_utilization"])
@pytest.mark.parametrize("value", [0.0, 1.2])
def test_memory_fractions_are_bounded(key, value):
    with pytest.raises(ConfigError, match=f"actor_rollout_ref.rollout.{key}"):
        load_config({"actor_rollout_ref": {"rollout": {key: value}}})


def test_several_bad_keys_are_reported_together():
    with pytest.raises(ConfigError) as info:
        load_config({"async_training": {"require_batches": 0, "trigger_parameter_sync_step": 0}})
    msg = str(info.value)
    assert "require_batches" in msg and "trigger_parameter_sync_step" in msg


def test_only_hybrid_needs_dynamic_scheduling():
    with pytest.raises(ConfigError) as info:
        load_config({"rollout": {"nnodes": 0}})
    msg = str(info.value)
    assert "rollout.nnodes is 0" in msg and "use_dynamic_resource_scheduling" in msg
    assert "Value error" not in msg
    cfg = load_config({"rollout": {"nnodes": 0}, "async_training": {"use_dynamic_resource_scheduling": True}})
    assert cfg.only_hybrid is True
    assert cfg.num_standalone_replicas == 0
    assert cfg.num_hybrid_replicas == 8


def test_trainer_needs_nodes():
    with pytest.raises(ConfigError, match="trainer.nnodes must be >= 1"):
        load_config({"trainer": {"nnodes": 0}})


def test_gpu_counts_must_divide_by_tensor_parallel_size():
    tp3 = {"actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 3}}}
    with pytest.raises(ConfigError, match="rollout has 8 GPUs, not a multiple of .*=3"):
        load_config(tp3)
    with pytest.raises(ConfigError, match="trainer has 8 GPUs"):
        load_config({**tp3, "rollout": {"nnodes": 0}, "async_training": {"use_dynamic_resource_scheduling": True}})


def test_standalone_memory_falls_back_to_gpu_memory_utilization():
    cfg = load_config({"actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.35}}})
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.standalone_gpu_memory_utilization is None
    assert rollout.effective_standalone_gpu_memory_utilization == 0.35
    cfg = load_config(
        {"actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.35, "standalone_gpu_memory_utilization": 0.75}}}
    )
    assert cfg.actor_rollout_ref.rollout.effective_standalone_gpu_memory_utilization == 0.75


def test_assignment_is_validated():
    cfg = DynresConfig()
    with pytest.raises(Exception, match="staleness_threshold"):
        cfg.async_training.staleness_threshold = -1


# ---- YAML ------------------------------------------------------------------------------------


def test_yaml_file_loads(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("async_training:\n  trigger_parameter_sync_step: 2\nrollout:\n  nnodes: 2\n")
    cfg = load_config(path)
    assert cfg.async_training.trigger_parameter_sync_step == 2
    assert cfg.rollout.n_gpus == 16
    assert load_config(str(path)) == cfg


def test_empty_yaml_is_an_error_and_an_empty_mapping_gives_defaults(tmp_path):
    # An empty file is far more often a wrong path or a truncated copy than a wish for defaults.
    path = tmp_path / "empty.yaml"
    path.write_text("# only a comment\n")
    with pytest.raises(ConfigError, match="empty.yaml: the file is empty"):
        load_config(path)
    path.write_text("{}\n")
    assert load_config(path) == DynresConfig()


def test_yaml_dates_stay_strings(tmp_path):
    # PyYAML would make 2024-01-01 a datetime.date, which no field takes and JSON cannot hold.
    path = tmp_path / "d.yaml"
    path.write_text("async_training: {dynamic_schedule_policy: 2024-01-01}\n")
    assert load_config(path).async_training.dynamic_schedule_policy == "2024-01-01"


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{path}: file not found"):
        load_config(path)


def test_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path}: is a directory; give a YAML file"):
        read_yaml(tmp_path)


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("async_training:\n  staleness_threshold: [0.1\nrollout: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: invalid YAML at line ")


def test_bad_key_in_yaml_names_the_file(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("async_training:\n  stalenes_threshold: 0.2\n")
    with pytest.raises(ConfigError, match=f"^{path}: unknown key 'async_training.stalenes_threshold'"):
        load_config(path)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "3\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{path}: expected a mapping"):
        load_config(path)


def test_config_errors_are_dynres_and_value_errors():
    with pytest.raises(DynresError):
        load_config({"x": 1})
    with pytest.raises(ValueError):
        validate_model(AsyncTrainingConfig, {"x": 1})


# ---- Policy params from config -------------------------------------------------------------


class WithRatio(Policy):
    name = "with_ratio"

    class Params(Policy.Params):
        deactivate_ratio: float = Field(0.3, ge=0.0, le=1.0)
        other: int = 1


class WithoutRatio(Policy):
    name = "without_ratio"

    class Params(Policy.Params):
        other: int = 1


def test_policy_params_from_config_fills_deactivate_ratio():
    cfg = AsyncTrainingConfig(dynamic_schedule_deactivate_ratio=0.45)
    assert policy_params_from_config(cfg, WithRatio.Params) == {"deactivate_ratio": 0.45}


def test_explicit_policy_params_win_over_the_top_level_ratio():
    cfg = AsyncTrainingConfig(
        dynamic_schedule_deactivate_ratio=0.45,
        dynamic_schedule_policy_params={"deactivate_ratio": 0.1, "other": 4},
    )
    assert policy_params_from_config(cfg, WithRatio.Params) == {"deactivate_ratio": 0.1, "other": 4}


def test_policy_without_a_ratio_gets_none():
    cfg = AsyncTrainingConfig(dynamic_schedule_deactivate_ratio=0.45, dynamic_schedule_policy_params={"other": 2})
    assert policy_params_from_config(cfg, WithoutRatio.Params) == {"other": 2}


def test_policy_params_from_config_does_not_mutate_the_config():
    cfg = AsyncTrainingConfig(dynamic_schedule_policy_params={"other": 2})
    policy_params_from_config(cfg, WithRatio.Params)
    assert cfg.dynamic_schedule_policy_params == {"other": 2}


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize(
    "where",
    [
        lambda v: {"async_training": {"staleness_threshold": v}},
        lambda v: {"actor_rollout_ref": {"rollout": {"gpu_memory_utilization": v}}},
    ],
)
def test_non_finite_numbers_are_rejected(where, value):
    # inf passes every lower bound and would overflow int() in buffer sizes later.
    with pytest.raises(ConfigError, match="finite number"):
        load_config(where(value))


def test_set_items_parse_as_yaml_and_merge_dotted() -> None:
    from dynres.core.config import apply_overrides, parse_set_items

    overrides = parse_set_items(["run.steps=3", "a.b.c=[1, 2]", "flag=", "run.steps=4"])
    assert overrides == {"run.steps": 4, "a.b.c": [1, 2], "flag": None}
    base = {"run": {"steps": 1, "seed": 7}}
    merged = apply_overrides(base, overrides)
    assert merged == {"run": {"steps": 4, "seed": 7}, "a": {"b": {"c": [1, 2]}}, "flag": None}
    assert base == {"run": {"steps": 1, "seed": 7}}  # the input is not changed
    with pytest.raises(ConfigError, match=r"'run.steps' is a value \(1\), not a section"):
        apply_overrides(base, {"run.steps.x": 1})
    with pytest.raises(ConfigError, match="dot-separated names"):
        apply_overrides(base, {"run..steps": 1})
    with pytest.raises(ConfigError, match=r"--set run.steps: value '\{a: 1' is not valid YAML"):
        parse_set_items(["run.steps={a: 1"])


# ---- verl's keys dynres does not model ---------------------------------------------------------------


def test_verl_only_keys_are_dropped_whole_sections_named_once():
    from dynres.core.config import DynresConfig, drop_verl_only_keys, is_verl_key

    data = {
        "data": {"train_files": "x", "max_prompt_length": 10},
        "trainer": {"nnodes": 2, "n_gpus_per_node": 8, "total_epochs": 3},
        "async_training": {"staleness_treshold": 0.5, "use_trainer_do_validate": False},
        "actor_rollout_ref": {"rollout": {"engine_kwargs": {"vllm": {"anything": 1}}}},
    }
    rest, removed = drop_verl_only_keys(data, DynresConfig)
    assert removed == [
        "data",
        "trainer.total_epochs",
        "async_training.use_trainer_do_validate",
        "actor_rollout_ref.rollout.engine_kwargs",
    ]
    assert rest["trainer"] == {"nnodes": 2, "n_gpus_per_node": 8}
    assert rest["async_training"] == {"staleness_treshold": 0.5}  # a typo is neither: kept, so validation names it
    assert is_verl_key("actor_rollout_ref.rollout.engine_kwargs.vllm.anything")  # verl accepts anything below
    assert not is_verl_key("trainer.total_epoks")
