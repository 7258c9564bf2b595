"""trainer.logger (verl's key), the tracking names of a cycle's metrics and the tracking-backend hook."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dynres.core import get_plugin_manager, hookimpl, load_config, register_plugin
from dynres.core.errors import ConfigError, MissingExtraError
from dynres.core.metrics import tracking_metrics
from dynres.core.tracking import TrackedRun, Tracker, TrackingBackend


def test_trainer_logger_reads_verl_forms():
    assert load_config({}).trainer.logger == ["console"]
    assert load_config({"trainer": {"logger": "tensorboard"}}).trainer.logger == ["tensorboard"]
    cfg = load_config({"trainer": {"logger": ["console", "wandb", "console"], "nnodes": 2}})
    assert cfg.trainer.logger == ["console", "wandb"]
    assert cfg.trainer.nnodes == 2  # the node keys stay in the same section
    with pytest.raises(ConfigError, match="a backend name is empty"):
        load_config({"trainer": {"logger": ["console", " "]}})


def test_tracking_metrics_use_verl_names_and_drop_what_backends_cannot_store():
    record = {
        "step": 3,
        "duration_s": 12.5,
        "wait_for_enough_samples_s": 1.5,
        "weight_sync_s": 0.25,
        "samples_generated": 64,
        "weight_version": 3,
        "dynamic_resource/mq_size": 7.0,
        "dynamic_resource/train_resource_utilization": math.nan,
        "activated": True,
        "deactivated": False,
        "step_wait_times": [0.1, 0.2],
        "reward/mean": 0.5,
        "policy": "default",
    }
    assert tracking_metrics(record) == {
        "timing_s/step": 12.5,
        "timing_s/wait_for_enough_samples": 1.5,
        "timing_s/param_sync": 0.25,
        "fully_async/rollouter/step_generated_samples": 64.0,
        "fully_async/count/current_param_version": 3.0,
        "dynamic_resource/mq_size": 7.0,
        "dynres/activated": 1.0,
        "dynres/deactivated": 0.0,
        "reward/mean": 0.5,
    }


class _Needy(TrackingBackend):
    name = "needy"
    modules = ("json", "no_such_module_for_dynres_tests")
    extra = "needy"

    def open(self, run: TrackedRun) -> Tracker:
        raise AssertionError("never opened")


def test_check_names_the_missing_module_and_the_install_line():
    with pytest.raises(MissingExtraError) as info:
        _Needy().check()
    msg = str(info.value)
    assert "'needy'" in msg and "'no_such_module_for_dynres_tests'" in msg
    assert "pip install 'dynres-runtime[needy]'" in msg
    assert "\n" not in msg


def test_third_party_install_line_without_an_extra():
    class Own(_Needy):
        distribution = "swanlab"
        extra = ""

    assert Own().install_line == "pip install swanlab"


def test_a_plugin_offers_backends_through_the_hook():
    class Plugin:
        @hookimpl
        def dynres_tracking_backends(self):
            return [_Needy()]

    pm = get_plugin_manager(load_plugins=False)
    register_plugin(pm, Plugin(), name="needy-plugin")
    offered = [b.name for found in pm.hook.dynres_tracking_backends() for b in found]
    assert offered == ["needy"]


def test_flat_config_and_file_name():
    run = TrackedRun("a/b[c]", "p", Path("out"), {"x": {"y": 1, "z": [1, 2]}, "w": {}})
    assert run.flat_config() == {"x.y": 1, "x.z": [1, 2], "w": {}}
    assert run.file_name == "a_b[c]"
