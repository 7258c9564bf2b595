"""Whole-run parity: the seed preset simulated with dynres's ``default`` and with verl's own ``default``.

``verl:default`` runs verl 0.9.1's policy code inside the dynres simulator (through the same
policy resolver as ``dynres simulate --policy verl:default``).
"""

from __future__ import annotations

import pytest

sim = pytest.importorskip("dynres.runtime.sim", reason="the whole-run check needs dynres-runtime")


@pytest.mark.slow
def test_seed_preset_default_and_verl_default_take_the_same_time():
    ours = sim.simulate("seed-dynamic-16-16", policy="default")
    theirs = sim.simulate("seed-dynamic-16-16", policy="verl:default")
    assert theirs.policy == "verl_default"
    a, b = ours.report, theirs.report
    assert len(a.cycles) == len(b.cycles) >= 10
    assert [(c.activated, c.deactivate_wait_samples) for c in a.cycles] == [
        (c.activated, c.deactivate_wait_samples) for c in b.cycles
    ]
    assert a.end_to_end_s == b.end_to_end_s
    assert sum(c.activated for c in a.cycles) >= 5  # the run did switch
