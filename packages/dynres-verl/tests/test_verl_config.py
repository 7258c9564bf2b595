"""verl's own shipped fully-async config, as Hydra composes it, is a valid dynres config."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

hydra = pytest.importorskip("hydra", reason="composing verl's config needs hydra-core")
cli = pytest.importorskip("dynres.runtime.cli", reason="dynres config check is in dynres-runtime")


@pytest.fixture(scope="module")
def composed(tmp_path_factory):
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = os.path.join(os.path.dirname(verl.__file__), "experimental/fully_async_policy/config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(
            config_name="fully_async_ppo_trainer",
            overrides=[
                "async_training.use_dynamic_resource_scheduling=true",
                "async_training.dynamic_schedule_policy=verl:default",
                "trainer.nnodes=2",
            ],
        )
    OmegaConf.resolve(cfg)
    path = tmp_path_factory.mktemp("verl") / "fully_async_ppo_trainer.yaml"
    OmegaConf.save(cfg, path)
    return path


def test_verls_shipped_config_passes_config_check(composed):
    res = CliRunner().invoke(cli.main, ["config", "check", str(composed)])
    assert res.exit_code == 0, res.stderr
    assert "is a valid dynres config" in res.stdout and "policy: verl_default (verl:default)" in res.stdout
    assert "16 trainer GPUs, 8 rollout GPUs, dynamic scheduling" in res.stdout
    (line,) = res.stderr.strip().splitlines()
    assert "verl key(s) dynres does not model" in line


def test_strict_rejects_it(composed):
    res = CliRunner().invoke(cli.main, ["config", "check", "--strict", str(composed)])
    assert res.exit_code == 2 and "unknown key" in res.stderr
