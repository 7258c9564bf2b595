"""Renamed user-facing keys: each old name still works with one warning line naming the new one.

A run file's ``cluster:`` is now ``ray:`` and its ``run.startup_probe`` is ``run.calibration_switches``;
report.json's ``startup_probe`` is ``switch_calibration``. A person's file that gives both names is an
error naming both; a file an older dynres wrote is read as it is (``tests/data/tiny-static``).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynres.core.errors import ConfigError
from dynres.runtime.realrun import load_run_config, plan_launch
from dynres.runtime.realrun.config import RunConfig
from dynres.runtime.renamed_keys import RENAMED_REPORT_KEYS, RENAMED_RUN_KEYS, upgrade_keys
from dynres.runtime.sim.fit import fit_scenario
from dynres.runtime.sim.metrics_io import read_metrics, read_report

TINY = Path(__file__).parent / "data" / "tiny-static"
"""A run an older dynres wrote: its config.json has ``cluster``, its report.json ``startup_probe``."""

RUN: dict[str, Any] = {  # a run file's document
    "run": {"steps": 2},
    "engines": {"runtime": "local"},
    "rollout": {"nnodes": 1, "n_gpus_per_node": 1},
    "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _file(tmp_path: Path, **sections: object) -> Path:
    data = copy.deepcopy(RUN)
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ---- cluster: -> ray: ---------------------------------------------------------------------------


def test_a_run_files_cluster_section_is_read_as_ray_with_one_warning(tmp_path, caplog) -> None:
    path = _file(tmp_path, cluster={"address": "10.0.0.1:6379", "namespace": "old"})
    cfg = load_run_config(path)
    assert (cfg.ray.address, cfg.ray.namespace) == ("10.0.0.1:6379", "old")
    assert _warnings(caplog) == [f"{path}: 'cluster' is deprecated and read as 'ray'; rename it to 'ray'"]
    # The resolved config (what config.json holds) has only the new name.
    assert "ray" in cfg.model_dump() and "cluster" not in cfg.model_dump()


def test_a_run_file_with_both_cluster_and_ray_is_an_error_naming_both(tmp_path, caplog) -> None:
    path = _file(tmp_path, cluster={"address": "a:1"}, ray={"address": "b:2"})
    with pytest.raises(ConfigError, match=r"'cluster' and 'ray' are both given; .*keep only 'ray'") as err:
        load_run_config(path)
    assert str(path) in str(err.value)
    # The same through the model alone (a mapping built in Python).
    with pytest.raises(ValueError, match=r"'cluster' and 'ray' are both given"):
        RunConfig.model_validate({**RUN, "cluster": {}, "ray": {}})


def test_the_model_alone_reads_cluster_too(caplog) -> None:
    cfg = RunConfig.model_validate({**RUN, "cluster": {"namespace": "x"}})
    assert cfg.ray.namespace == "x"
    assert _warnings(caplog) == ["run config: 'cluster' is deprecated and read as 'ray'; rename it to 'ray'"]


def test_set_cluster_keys_are_read_as_ray_keys(tmp_path, caplog) -> None:
    path = _file(tmp_path)
    cfg = load_run_config(path, {"cluster.address": "h:1"})
    assert cfg.ray.address == "h:1"
    assert _warnings(caplog) == ["--set cluster.address: 'cluster' is deprecated and read as 'ray'; rename it to 'ray'"]
    with pytest.raises(ConfigError, match=r"'cluster.address' and 'ray.address' are both given"):
        load_run_config(path, {"cluster.address": "h:1", "ray.address": "h:2"})
    # An old file with a new --set key, and the --address shorthand, go to the same place.
    old = _file(tmp_path, cluster={"namespace": "n"})
    assert load_run_config(old, {"ray.address": "h:3"}).ray.address == "h:3"
    plan = plan_launch(old, address="h:4", plots=False, out_dir=tmp_path / "out")
    assert (plan.config.ray.address, plan.config.ray.namespace) == ("h:4", "n")
    with pytest.raises(ConfigError, match=r"--address and --set ray.address=\.\.\. both set ray.address"):
        plan_launch(path, address="h:4", sets=["cluster.address=h:5"], plots=False, out_dir=tmp_path / "out")


# ---- run.startup_probe -> run.calibration_switches ----------------------------------------------


def test_run_startup_probe_is_read_as_calibration_switches_with_one_warning(tmp_path, caplog) -> None:
    path = _file(tmp_path, run={"startup_probe": 3})
    assert load_run_config(path).run.calibration_switches == 3
    assert _warnings(caplog) == [
        f"{path}: 'run.startup_probe' is deprecated and read as 'run.calibration_switches'; "
        "rename it to 'run.calibration_switches'"
    ]
    caplog.clear()
    assert load_run_config(_file(tmp_path), {"run.startup_probe": 0}).run.calibration_switches == 0
    assert len(_warnings(caplog)) == 1 and "'run.calibration_switches'" in _warnings(caplog)[0]
    with pytest.raises(ConfigError, match=r"'run.startup_probe' and 'run.calibration_switches' are both given"):
        load_run_config(_file(tmp_path, run={"startup_probe": 1, "calibration_switches": 2}))


def test_new_names_warn_nothing(tmp_path, caplog) -> None:
    cfg = load_run_config(_file(tmp_path, ray={"namespace": "x"}, run={"calibration_switches": 2}))
    assert (cfg.ray.namespace, cfg.run.calibration_switches) == ("x", 2)
    assert _warnings(caplog) == []


# ---- files an older dynres wrote ----------------------------------------------------------------


def test_an_old_report_json_is_read_with_switch_calibration(caplog) -> None:
    report, path = read_report(TINY)
    assert "startup_probe" not in report and report["switch_calibration"]["steps"]
    assert _warnings(caplog) == [
        f"report {path}: 'startup_probe' (written by an older dynres) is read as 'switch_calibration'"
    ]
    # A report with both names keeps the new one.
    both = {"startup_probe": {"old": 1}, "switch_calibration": {"new": 1}}
    assert upgrade_keys(both, RENAMED_REPORT_KEYS, "r", written_by_dynres=True) == {"switch_calibration": {"new": 1}}


def test_the_fit_reads_an_old_runs_files_and_takes_its_calibration(caplog) -> None:
    fit = fit_scenario(read_metrics(TINY))
    assert "switch calibration" in fit.notes["costs.wake_up_s"]  # from report.json's startup_probe
    assert "ray.address null" in fit.notes["cluster.shared_host"]  # from config.json's cluster
    # One warning per old key of each file, each naming the new key.
    warned = _warnings(caplog)
    assert sorted(w.split(": ", 1)[1] for w in warned) == [
        "'cluster' (written by an older dynres) is read as 'ray'",
        "'run.startup_probe' (written by an older dynres) is read as 'run.calibration_switches'",
        "'startup_probe' (written by an older dynres) is read as 'switch_calibration'",
    ]
    # An old config handed in as a mapping (what --config passes) is read the same way.
    caplog.clear()
    config = json.loads((TINY / "config.json").read_text())
    fit = fit_scenario(read_metrics(TINY), config=config, config_source="old.yaml")
    assert "ray.address null" in fit.notes["cluster.shared_host"]
    assert "old.yaml: 'cluster' is deprecated and read as 'ray'; rename it to 'ray'" in _warnings(caplog)


def test_upgrade_keys_leaves_its_input_alone() -> None:
    data = {"run": {"startup_probe": 1, "steps": 2}, "cluster": {"a": 1}}
    before = copy.deepcopy(data)
    out = upgrade_keys(data, RENAMED_RUN_KEYS, "f")
    assert data == before
    assert out == {"run": {"steps": 2, "calibration_switches": 1}, "ray": {"a": 1}}
    assert upgrade_keys(None, RENAMED_RUN_KEYS, "f") is None
