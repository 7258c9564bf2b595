"""The verl-hosted simulation: verl 0.9.1's own controller and trainer order over dynres's simulated engines.

With the dynres runtime's timing (:data:`DYNRES_TIMING`), verl's ``default`` in the verl loop must
make exactly the decisions of dynres's ``default`` in the dynres runtime, and ``dynres:predictive``
(which reads every figure it needs from verl's live state through the adapter) those of
``predictive``: anything else the host does (verl's controller, its call order, the context verl
builds, the stand-ins) is then shown faithful. With verl's own timing, the time stays within 1%
for ``default`` on the seed preset.
"""

from __future__ import annotations

import json

import pytest

sim = pytest.importorskip("dynres.runtime.sim", reason="the verl loop needs dynres-runtime")
verl_host = pytest.importorskip("dynres.runtime.sim.verl_host")

from dynres.core.errors import PolicyNotFoundError, ScenarioError  # noqa: E402  (after the skips)

SEED_PRESET = "seed-dynamic-16-16"
DYNAMIC_ON = {"async_training.use_dynamic_resource_scheduling": True}


def decisions(result) -> list[tuple[bool, int | None]]:
    return [(c.activated, c.deactivate_wait_samples) for c in result.report.cycles]


@pytest.mark.slow
def test_verls_default_in_the_verl_loop_decides_as_dynres_default_does():
    ours = sim.simulate(SEED_PRESET, policy="default")
    theirs = sim.simulate(SEED_PRESET, policy="default", host="verl", verl_timing=verl_host.DYNRES_TIMING)
    assert theirs.label == f"{SEED_PRESET}[verl:default]" and theirs.host == "verl"
    assert len(theirs.report.cycles) == len(ours.report.cycles) >= 30
    assert decisions(theirs) == decisions(ours)
    assert theirs.end_to_end_s == pytest.approx(ours.end_to_end_s, rel=1e-9)
    assert sum(c.activated for c in theirs.report.cycles) >= 10  # the run did switch
    # Every admitted sample trained once or left accounted for, as in any simulated run.
    assert theirs.ledger is not None and not theirs.ledger.problems()


@pytest.mark.slow
def test_with_verls_own_timing_the_seed_preset_stays_within_one_percent():
    ours = sim.simulate(SEED_PRESET, policy="default")
    theirs = sim.simulate(SEED_PRESET, policy="default", host="verl")
    assert theirs.end_to_end_s == pytest.approx(ours.end_to_end_s, rel=0.01)
    # ...but it is verl's timing, not dynres's: the two runs part somewhere.
    assert decisions(theirs) != decisions(ours) or theirs.end_to_end_s != ours.end_to_end_s


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["seed-dynamic-16-16", "verl-7b-async-64-64"])
def test_predictive_inside_verl_reads_what_it_reads_in_the_dynres_runtime(preset):
    # Same decisions and times: every field predictive reads reaches it from verl's live state
    # (a field left at 0 inside verl changes its forecasts and so its decisions).
    ours = sim.simulate(preset, policy="predictive", overrides=DYNAMIC_ON)
    theirs = sim.simulate(
        preset, policy="dynres:predictive", host="verl", verl_timing=verl_host.DYNRES_TIMING, overrides=DYNAMIC_ON
    )
    assert decisions(theirs) == decisions(ours)
    assert theirs.end_to_end_s == pytest.approx(ours.end_to_end_s, rel=1e-3)


def test_the_controller_is_verls_own_class_and_verl_is_untouched_afterwards():
    from dynres.verl._verl import schedule_module

    mod = schedule_module()
    seen = {}
    real_init = verl_host.VerlTrainerLoop.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen["controller"] = self.verl_controller

    verl_host.VerlTrainerLoop.__init__ = spy
    try:
        sim.simulate("verl-7b-async-64-64", policy="dynres:fixed_ratio", host="verl", overrides=DYNAMIC_ON)
    finally:
        verl_host.VerlTrainerLoop.__init__ = real_init
    assert type(seen["controller"]) is mod.DynamicResourceController
    import ray
    from verl.experimental.fully_async_policy.dynamic_schedule import dynamic_resource_controller

    assert dynamic_resource_controller.ray is ray  # the shim is gone once the run ends


def test_names_are_verls_and_a_dynres_name_without_prefix_is_refused_with_the_fix():
    with pytest.raises(PolicyNotFoundError, match="dynres:predictive"):
        sim.simulate(SEED_PRESET, policy="predictive", host="verl")
    with pytest.raises(ScenarioError, match="unknown host"):
        sim.simulate(SEED_PRESET, host="vllm")
    with pytest.raises(ScenarioError, match="use_dynamic_resource_scheduling"):
        sim.simulate("seed-static-16-16", host="verl")


@pytest.mark.slow
def test_cli_runs_a_policy_inside_verl_and_says_so_in_the_json(tmp_path):
    from click.testing import CliRunner

    from dynres.runtime.cli import main

    out = tmp_path / "run.json"
    args = ["simulate", "--preset", "verl-7b-async-64-64", "--host", "verl", "--policy", "dynres:predictive"]
    args += ["--set", "async_training.use_dynamic_resource_scheduling=true"]
    res = CliRunner().invoke(main, [*args, "--compare-policy", "default", "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    payload = json.loads(out.read_text())
    assert [r["label"] for r in payload["runs"]] == [
        "verl-7b-async-64-64[dynres:predictive]",
        "verl-7b-async-64-64[verl:default]",
    ]
    assert {r["host"] for r in payload["runs"]} == {"verl"}
    bad = CliRunner().invoke(main, ["simulate", "--preset", "seed-static-16-16", "--host", "verl"])
    assert bad.exit_code == 2 and "use_dynamic_resource_scheduling" in bad.output
