"""The sample ledger every exactly-once check reads: each way a sample can go wrong is named."""

from __future__ import annotations

from dynres.runtime.loop.ledger import SampleLedger, checkpoint_sample_ids


def test_a_clean_run_has_no_problems() -> None:
    ledger = SampleLedger(admitted=["a", "b", "c", "d"], trained=["a", "b"], left=["c"], dropped=["d"])
    assert ledger.problems() == [] and ledger.lost == [] and ledger.duplicated == []


def test_each_kind_of_problem_is_found_and_named() -> None:
    twice = SampleLedger(admitted=["a", "b"], trained=["a", "a", "b"])
    assert twice.duplicated == ["a"] and "trained twice" in twice.problems()[0]
    held_and_trained = SampleLedger(admitted=["a"], trained=["a"], left=["a"])
    assert held_and_trained.duplicated == ["a"]
    lost = SampleLedger(admitted=["a", "b", "c"], trained=["a"], left=["b"])
    assert lost.lost == ["c"] and "neither trained, held nor dropped" in lost.problems()[0]
    unknown = SampleLedger(admitted=["a"], trained=["a", "z"])
    assert unknown.unknown == ["z"] and "never admitted" in unknown.problems()[0]


def test_checkpoint_ids_list_queued_then_partial() -> None:
    ckpt = {"queue": [{"group": {"sample_id": "q1"}}], "partial": [{"group": {"sample_id": "p1"}}]}
    assert checkpoint_sample_ids(ckpt) == ["q1", "p1"]
    assert checkpoint_sample_ids(None) == []
