"""Periodic checkpoints on disk and resuming from them: atomic writes, the ledger file, exactly once.

The runs are fakes on the virtual-time loop. A crash is the latest checkpoint's state plus
everything the process did after it: the resumed run starts from that checkpoint while the
ledger file still holds the lines written after it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from small_config import small_config, small_run

from dynres.core import get_plugin_manager, load_policy
from dynres.core.errors import BackendError, ConfigError
from dynres.runtime.backends.fake import FakeCluster, FakeTrainEngine, fake_prompts
from dynres.runtime.loop.checkpoint import CHECKPOINTS_DIR, LATEST_FILE, RUN_STATE_FILE, CheckpointStore
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec
from dynres.runtime.loop.ledger import LEDGER_FILE, LedgerWriter, SampleLedger, read_ledger
from dynres.runtime.sim.virtual_time import run_virtual

CFG = small_config(trainer_gpus=1)


STATIC = CFG.model_copy(
    update={"async_training": CFG.async_training.model_copy(update={"use_dynamic_resource_scheduling": False})}
)


def segment(out: Path, *, steps: int, resume: dict[str, Any] | None = None, every: int = 2) -> tuple[Any, Any]:
    """One run segment into folder ``out``: fresh, or resumed from ``resume`` (a loaded checkpoint)."""
    cl = FakeCluster(2, 1, tokens_per_s=100, response_tokens=20, phase_times={"update_actor": 0.5})
    done = resume["global_steps"] if resume else 0
    ledger = LedgerWriter(
        out / LEDGER_FILE,
        segment=resume["segment"] + 1 if resume else 0,
        keep_lines=resume["ledger_lines"] if resume else None,
    )
    start = resume["prompts"]["position"] if resume else 0
    prompts = fake_prompts(n=2)
    for _ in range(start):  # the prompt source restarted where the checkpoint says
        next(prompts)
    run = small_run(
        cl,
        prompts,
        config=CFG,
        num_cycles=steps - done,
        checkpoints=CheckpointStore(out / CHECKPOINTS_DIR),
        checkpoint_every=every,
        ledger=ledger,
        resume_from=resume,
    )
    try:
        return run_virtual(run.run()), run
    finally:
        ledger.close()


def audit(out: Path) -> SampleLedger:
    """The run folder's ledger against what its last checkpoint still holds and dropped."""
    last = CheckpointStore(out / CHECKPOINTS_DIR).load()
    lines = read_ledger(out / LEDGER_FILE)
    held = [d["group"]["sample_id"] for part in ("queue", "partial") for d in last[part]]
    admitted = [f"p{i}" for i in range(last["prompts"]["position"])]
    return SampleLedger(admitted=admitted, trained=[x["sample_id"] for x in lines], left=held, dropped=last["dropped"])


def test_periodic_checkpoints_hold_the_ledger_count_and_the_trainer(tmp_path: Path) -> None:
    report, run = segment(tmp_path, steps=5)
    store = run.spec.checkpoints
    assert store.saved == [2, 4, 5]
    # only the newest two are kept; latest.json names the last one
    assert sorted(p.name for p in store.root.glob("step-*")) == ["step-000004", "step-000005"]
    assert json.loads((store.root / LATEST_FILE).read_text())["path"] == "step-000005"
    last = store.load()
    lines = read_ledger(tmp_path / LEDGER_FILE)
    assert last["global_steps"] == 5 and last["ledger_lines"] == len(lines) == report.samples.consumed
    assert json.loads((store.latest() / "trainer" / "state.json").read_text())["steps"] == 10
    assert {x["segment"] for x in lines} == {0} and [x["cycle"] for x in lines][-1] == 5
    assert not audit(tmp_path).problems()
    assert "checkpoint" in report.operations.engine and report.operations.engine["checkpoint"].count == 3


def test_resume_after_a_crash_trains_every_admitted_sample_exactly_once(tmp_path: Path) -> None:
    segment(tmp_path, steps=6)
    # The process died after cycle 6's training but before checkpoint 6 was usable: resume at 4.
    store = CheckpointStore(tmp_path / CHECKPOINTS_DIR)
    at4 = store.load(store.root / "step-000004")
    lines_before = read_ledger(tmp_path / LEDGER_FILE)
    assert len(lines_before) > at4["ledger_lines"]  # lines of cycles 5-6 that the crash undoes
    second, _ = segment(tmp_path, steps=9, resume=at4)
    assert [c.step for c in second.cycles] == [5, 6, 7, 8, 9]
    assert second.weight_version == 9
    lines = read_ledger(tmp_path / LEDGER_FILE)
    assert lines[: at4["ledger_lines"]] == lines_before[: at4["ledger_lines"]]
    assert {x["segment"] for x in lines[at4["ledger_lines"] :]} == {1}
    assert [x["cycle"] for x in lines] == sorted(x["cycle"] for x in lines)
    ledger = audit(tmp_path)
    assert not ledger.problems(), ledger.problems()
    counts = Counter(x["sample_id"] for x in lines)
    assert max(counts.values()) == 1 and len(lines) == 9 * 8
    # the samples the checkpoint held were trained first, in the resumed segment
    held = [d["group"]["sample_id"] for part in ("queue", "partial") for d in at4[part]]
    assert held and set(held) <= {x["sample_id"] for x in lines[at4["ledger_lines"] :]}


def test_a_resume_that_readmits_a_trained_sample_is_caught(tmp_path: Path) -> None:
    segment(tmp_path, steps=4)
    store = CheckpointStore(tmp_path / CHECKPOINTS_DIR)
    at2 = store.load(store.root / "step-000002")
    wrong = {**at2, "prompts": {"position": at2["prompts"]["position"] - 1}}  # one too early
    segment(tmp_path, steps=5, resume=wrong)
    problems = audit(tmp_path).problems()
    assert problems and "trained twice" in problems[0]


def test_a_crash_while_writing_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    engine = FakeTrainEngine()
    run_virtual(store.save(2, {"global_steps": 2}, engine))
    engine.fail_on["save_state"] = BackendError("disk full")
    with pytest.raises(BackendError, match="disk full"):
        run_virtual(store.save(4, {"global_steps": 4}, engine))
    assert store.latest() == tmp_path / "step-000002" and store.load()["global_steps"] == 2
    # the half-built folder never counts, and the next successful save removes it
    assert list(tmp_path.glob(".tmp-step-000004-*"))
    engine.fail_on.clear()
    run_virtual(store.save(6, {"global_steps": 6}, engine))
    assert not list(tmp_path.glob(".tmp-step-*")) and store.load()["global_steps"] == 6


def test_a_crash_between_rename_and_latest_json_still_finds_a_whole_checkpoint(tmp_path: Path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path, keep=3)
    run_virtual(store.save(2, {"global_steps": 2}, None))
    real = os.replace

    def crash_on_latest(src: Any, dst: Any) -> None:
        if str(dst).endswith(LATEST_FILE):
            raise OSError("killed")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_latest)
    with pytest.raises(OSError):
        run_virtual(store.save(4, {"global_steps": 4}, None))
    monkeypatch.undo()
    # latest.json still names step 2, which is whole; step 4 is whole too (renamed complete)
    assert store.load()["global_steps"] == 2
    (tmp_path / LATEST_FILE).unlink()
    assert store.load()["global_steps"] == 4  # without latest.json: the highest complete folder
    (tmp_path / "step-000004" / RUN_STATE_FILE).unlink()
    assert store.load()["global_steps"] == 2  # an incomplete folder is never taken


def test_no_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint in"):
        CheckpointStore(tmp_path).load()


def test_ledger_writer_keeps_only_the_checkpointed_lines_and_skips_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / LEDGER_FILE
    path.write_text('{"sample_id": "a"}\n{"sample_id": "b"}\n{"sample_i')
    assert [x["sample_id"] for x in read_ledger(path)] == ["a", "b"]
    w = LedgerWriter(path, segment=1, keep_lines=1)
    assert w.lines == 1 and w.rolled_back == 2
    w.close()
    assert read_ledger(path) == [{"sample_id": "a"}]


def test_checkpoint_every_needs_a_store() -> None:
    cl = FakeCluster(1, 0)
    with pytest.raises(ConfigError, match="checkpoints is None"):
        RunSpec(
            config=CFG,
            policy=load_policy("default"),
            standalone=cl.standalone,
            hybrid=[],
            train_engine=cl.engine,
            prompts=[],
            num_cycles=1,
            checkpoint_every=2,
        )


def test_checkpoint_save_failure_does_not_end_the_run(tmp_path: Path) -> None:
    cl = FakeCluster(2, 0, tokens_per_s=100, response_tokens=20, phase_times={"update_actor": 0.5})
    cl.engine.fail_on["save_state"] = BackendError("disk full")
    run = FullyAsyncRun(
        RunSpec(
            config=STATIC,
            policy=load_policy("static_fully_async"),
            standalone=cl.standalone,
            hybrid=[],
            train_engine=cl.engine,
            prompts=fake_prompts(n=2),
            num_cycles=3,
            plugin_manager=get_plugin_manager(load_plugins=False),
            checkpoints=CheckpointStore(tmp_path),
            checkpoint_every=1,
        )
    )
    report = run_virtual(run.run())
    assert len(report.cycles) == 3 and report.operations.engine["checkpoint"].failures == 3
    assert any(f.op == "checkpoint" for f in report.op_failures)


def test_a_crash_while_writing_run_json_leaves_no_partial_checkpoint(tmp_path: Path, monkeypatch) -> None:
    from dynres.runtime.loop import checkpoint as mod

    store = CheckpointStore(tmp_path)
    run_virtual(store.save(2, {"global_steps": 2}, None))
    real = mod._write_synced

    def half_then_die(path: Path, text: str) -> None:
        if path.name == RUN_STATE_FILE:
            path.write_text(text[: len(text) // 2])
            raise OSError("killed while writing")
        real(path, text)

    monkeypatch.setattr(mod, "_write_synced", half_then_die)
    with pytest.raises(OSError):
        run_virtual(store.save(4, {"global_steps": 4, "queue": ["x"] * 50}, None))
    monkeypatch.undo()
    assert not (tmp_path / "step-000004").exists()
    (tmp_path / LATEST_FILE).unlink()
    assert store.load()["global_steps"] == 2
