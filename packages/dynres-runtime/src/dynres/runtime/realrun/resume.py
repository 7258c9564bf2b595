"""``dynres run CONFIG --resume DIR``: the checkpoint a run goes on from, and the run folder's audit.

:func:`resume_point` picks DIR's latest checkpoint and checks, before anything starts, that the run
file can go on from it (same policy, cycles left to run). The resumed run writes into DIR: its
cycles are appended to ``metrics.jsonl`` after the records the checkpoint covers (and the
checkpoint's own cycle's record when the killed process had not written it: :func:`lost_cycle_record`), its trained
samples to ``ledger.jsonl`` after the lines the checkpoint counted (the lines and records written
after the checkpoint belong to work that died with the process; those samples are trained again).

:func:`audit_run_folder` answers "was every admitted sample trained exactly once?" from the files
alone: the ledger, and the latest checkpoint's prompt position (the ids the toy prompt source
handed out are ``s0 ... s<position-1>``), queue, partial samples and stale drops.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynres.core.errors import ConfigError
from dynres.runtime.loop.checkpoint import CHECKPOINTS_DIR, CYCLE_RECORD_KEY, CheckpointStore
from dynres.runtime.loop.ledger import LEDGER_FILE, SampleLedger, checkpoint_sample_ids, read_ledger
from dynres.runtime.realrun.config import RunConfig, load_run_policy


def resume_point(folder: str | Path, cfg: RunConfig) -> dict[str, Any]:
    """The latest checkpoint of run folder ``folder``, checked against ``cfg``; ConfigError naming
    the problem and the fix when there is none or the run file cannot go on from it."""
    out = Path(folder)
    if not out.is_dir():
        raise ConfigError(f"--resume {out}: no such run folder; give the --out folder of the run to continue")
    ckpt = CheckpointStore(out / CHECKPOINTS_DIR).load()
    done, steps = int(ckpt["global_steps"]), cfg.run.steps
    if done >= steps:
        raise ConfigError(
            f"--resume {out}: its latest checkpoint is at cycle {done}, and run.steps is {steps}; "
            f"raise run.steps (--steps) above {done} to train further"
        )
    policy = load_run_policy(cfg)
    if ckpt["policy"]["name"] != policy.name:
        raise ConfigError(
            f"--resume {out}: the checkpoint was written by policy {ckpt['policy']['name']!r} but the run file "
            f"names {policy.name!r}; resume with the same policy"
        )
    return ckpt


def keep_metrics(path: Path, steps: int) -> int:
    """Keep the records of ``metrics.jsonl`` up to cycle ``steps`` (the checkpoint's); return how many
    records were dropped (they belong to cycles the resumed run does again)."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            if int(json.loads(line)["step"]) <= steps:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a partial last record of a killed process
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return len(lines) - len(kept)


def lost_cycle_record(path: Path, ckpt: dict[str, Any]) -> dict[str, Any] | None:
    """The metrics record of the checkpoint's own cycle when ``path`` (kept up to that cycle) lacks
    it: the process was killed after the checkpoint but before it wrote the record. The checkpoint's
    copy (:data:`~dynres.runtime.loop.checkpoint.CYCLE_RECORD_KEY`) stood before the cycle's decisions,
    which the resumed run asks again at its start. None when the file has it or the checkpoint has none."""
    record = ckpt.get(CYCLE_RECORD_KEY)
    if not isinstance(record, dict):
        return None
    step = int(ckpt["global_steps"])
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if int(json.loads(line)["step"]) == step:
                    return None
            except (ValueError, KeyError, TypeError):
                continue
    return record


@dataclass(frozen=True)
class LedgerAudit:
    """What a run folder's files say about its samples (counts, and the ledger behind them)."""

    admitted: int
    """Samples the prompt source handed out over every segment (count)."""
    trained: int
    """Lines of ledger.jsonl (count)."""
    held: int
    """Samples the latest checkpoint still holds, queued or partial (count)."""
    dropped: int
    """Samples dropped as too stale, over every segment (count)."""
    lost: int
    """Admitted samples neither trained, held nor dropped (count; must be 0)."""
    duplicated: int
    """Samples trained twice, or trained and still held (count; must be 0)."""
    segments: int
    """Run segments in the ledger (1 + resumes; count)."""
    ledger: SampleLedger
    """The ids behind the counts."""


def audit_run_folder(folder: str | Path, *, id_prefix: str = "s") -> LedgerAudit:
    """Audit run folder ``folder`` (its ledger against its latest checkpoint); ConfigError without one.

    ``id_prefix``: the prompt source's ids are ``<prefix><k>`` for k below the checkpoint's position.
    """
    out = Path(folder)
    last = CheckpointStore(out / CHECKPOINTS_DIR).load()
    lines = read_ledger(out / LEDGER_FILE)
    ledger = SampleLedger(
        admitted=[f"{id_prefix}{k}" for k in range(int(last["prompts"]["position"]))],
        trained=[line["sample_id"] for line in lines],
        left=checkpoint_sample_ids(last),
        dropped=list(last.get("dropped", [])),
    )
    return LedgerAudit(
        admitted=len(ledger.admitted),
        trained=len(ledger.trained),
        held=len(ledger.left),
        dropped=len(ledger.dropped),
        lost=len(ledger.lost),
        duplicated=len(ledger.duplicated),
        segments=len({line.get("segment", 0) for line in lines}) or 1,
        ledger=ledger,
    )


def ledger_summary(folder: str | Path) -> str | None:
    """:func:`audit_line` of run folder ``folder``, or None when it has no checkpoint to audit against."""
    try:
        return audit_line(audit_run_folder(folder))
    except ConfigError:
        return None


def audit_line(audit: LedgerAudit) -> str:
    """The audit in one line, as ``dynres run`` ends with it."""
    return (
        f"ledger: {audit.trained} samples trained over {audit.segments} segment(s), {audit.held} held by the "
        f"checkpoint, {audit.dropped} dropped stale, {audit.lost} lost, {audit.duplicated} trained twice "
        f"(of {audit.admitted} admitted)"
    )
