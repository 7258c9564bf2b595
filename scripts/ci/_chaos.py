"""The chaos run of scripts/ci/70-chaos.sh (run by it; its name keeps the CI loop from running it).

One tiny real run (Ray + vLLM on CPU + torch, examples/tiny-grpo-cpu.yaml), three faults:

1. after cycle 2, SIGKILL the process of the actor of standalone replica `standalone-1`;
2. after cycle 3, SIGKILL the process of the actor of hybrid replica `hybrid-0`;
3. once both are back (the latest checkpoint records it) and one more cycle has trained past
   that checkpoint, SIGKILL the whole `dynres run` process group (whatever cycle that is: the
   first segment asks for more cycles than it gets), then `dynres run --resume` for RESUMED more
   cycles after the checkpoint.

Checked from the run folder's files: each replica back within restart_limit_s() of the run's first
engine start; the resumed run completes its cycles; ledger.jsonl has every admitted sample trained
exactly once (0 lost, 0 duplicated) over 2 segments; weight_version goes on to the last cycle; the
trainer's AdamW step count goes on from the checkpoint's; when the model had learned by the
checkpoint, the reward of the resumed cycles starts where the checkpoint left it (not from a fresh
model's ~0.5) and stays above the run's first cycles. Prints, per fault, the time to return, the
ledger's counts and the reward before and after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dynres.runtime.backends.train_state import TRAIN_STATE_FILE
from dynres.runtime.loop.checkpoint import TRAINER_DIR, CheckpointStore
from dynres.runtime.loop.ledger import SampleLedger, checkpoint_sample_ids, read_ledger
from dynres.runtime.realrun.resume import audit_run_folder

FIRST_STEPS = 200
"""Cycles the first segment asks for (it is killed long before)."""
RESUMED = 6
"""Cycles the resumed segment runs after the checkpoint."""
RESTART_LIMIT_S = 90.0
"""Longest a killed replica may take to serve again on 2 CPU cores where the run's engines start in
up to RESTART_LIMIT_S / RESTART_PER_START s (docs/real-runs.md says so): a vLLM CPU engine takes 15-30 s
to build there, more while the other engines compete for the cores."""
RESTART_PER_START = 3.0
"""On a slower machine the limit is this many times the run's own first engine start
(backend.json engines_start_s): a restart builds its engine while the run keeps the cores busy, and
here both killed replicas rebuild at once. CI has measured 1.1x (174 s to engines up, 194 s back, at
load) and 2.25x (55 s up, 122-124 s back); 3x leaves room for that spread. A failed attempt and its
retry show in the time outside the rebuild (OUTSIDE_REBUILD_S), which has its own limit."""
OUTSIDE_REBUILD_S = 30.0
"""Longest a killed replica's return may take beyond the rebuild of the attempt that brought it back
(seconds): the 1 s backoff, the health probe and the weight load, the part the controller owns, and
any failed attempt before it (seen here: 1.0-1.3 s)."""
KEY = "cycle_mean/reward/mean"
LEARNED = 0.1
"""Rise of the reward by the checkpoint over the first 3 cycles above which the model has learned
(mean reward, 0-1): below it the run fell into the toy task's absorbing state (see main)."""

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(sys.argv[1])
RUN = OUT / "run"
DYNRES = str(ROOT / ".venv" / "bin" / "dynres")
SETS = ["--set", "run.checkpoint_every=2", "--set", f"ray.temp_dir={OUT / 'ray'}"]
COMMAND = [DYNRES, "run", str(ROOT / "examples" / "tiny-grpo-cpu.yaml"), "--out", str(RUN), "-q", "--no-plot"]

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def records() -> list[dict]:
    path = RUN / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a record being written
    return out


def read_json(path: Path) -> dict:
    """The JSON object in ``path``, or {} while it is missing or being written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def latest_checkpoint_dir() -> Path:
    """The newest complete checkpoint's folder (the store's own rule)."""
    path = CheckpointStore(RUN / "checkpoints").latest()
    if path is None:
        sys.exit(f"no checkpoint under {RUN / 'checkpoints'}")
    return path


def optimizer_steps(ckpt_dir: Path) -> int:
    """AdamW's step count in the train state a checkpoint holds (torch's own state, not a dynres
    counter): a trainer that resumed from scratch would count only the resumed cycles' steps."""
    import torch

    state = torch.load(ckpt_dir / TRAINER_DIR / TRAIN_STATE_FILE, map_location="cpu", weights_only=True)
    return int(max(float(p["step"]) for p in state["optimizer"]["state"].values()))


def latest_checkpoint() -> dict:
    name = read_json(RUN / "checkpoints" / "latest.json").get("path")
    return read_json(RUN / "checkpoints" / name / "run.json") if name else {}


def wait(pred, what: str, proc: subprocess.Popen, timeout_s: float = 300.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if proc.poll() is not None:
            sys.exit(f"FAIL the run ended (status {proc.returncode}) while waiting for {what}; see {OUT}/run1.log")
        if time.monotonic() > deadline:
            sys.exit(f"FAIL no {what} within {timeout_s:.0f} s")
        time.sleep(0.2)


def session_pids() -> list[int]:
    """Processes of the run's own Ray session (their command line names its private temp dir)."""
    mark = str(OUT / "ray").encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if mark in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def back(ckpt: dict) -> dict[str, float]:
    return {r["replica"]: r["seconds_to_return"] for r in ckpt.get("replica_restarts", []) if r["seconds_to_return"]}


def main() -> None:
    t0 = time.monotonic()
    with (OUT / "run1.log").open("w") as log:
        proc = subprocess.Popen(
            [*COMMAND, "--steps", str(FIRST_STEPS), *SETS], stdout=log, stderr=log, start_new_session=True
        )
    pids = wait(lambda: read_json(RUN / "backend.json").get("pids"), "engine pids", proc)
    engines_start_s = float(read_json(RUN / "backend.json").get("engines_start_s") or 0.0)
    print(
        f"engines up after {time.monotonic() - t0:.0f} s (engines_start_s {engines_start_s:.0f} s): {pids}", flush=True
    )
    wait(lambda: len(records()) >= 2, "cycle 2", proc)
    os.kill(pids["standalone-1"], signal.SIGKILL)
    print(f"SIGKILL standalone-1 (pid {pids['standalone-1']}) after cycle {len(records())}", flush=True)
    wait(lambda: len(records()) >= 3, "cycle 3", proc)
    os.kill(pids["hybrid-0"], signal.SIGKILL)
    print(f"SIGKILL hybrid-0 (pid {pids['hybrid-0']}) after cycle {len(records())}", flush=True)
    ckpt = wait(
        lambda: (c := latest_checkpoint()) and {"standalone-1", "hybrid-0"} <= set(back(c)) and c,
        "both replicas back in a checkpoint",
        proc,
    )
    at = ckpt["global_steps"]
    wait(lambda: len(records()) > at and len(records()) % 2 == 1, "a cycle trained past the checkpoint", proc)
    done_before = len(records())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    left = session_pids()
    for pid in left:  # what Ray started in its own sessions survives the group kill
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # The checkpoint --resume will take, by the store's own rule: one committed as the kill landed
    # can be newer than what latest.json named a moment before (a clean-clone run resumed at 38
    # where latest.json had said 36).
    ckpt = CheckpointStore(RUN / "checkpoints").load()
    print(
        f"SIGKILL the dynres run process group after cycle {done_before} (checkpoint at {ckpt['global_steps']}); "
        f"{len(left)} Ray session processes killed after it; segment 1 took {time.monotonic() - t0:.0f} s",
        flush=True,
    )
    at_ckpt = ledger_at(ckpt)
    check(
        at_ckpt.lost == [] and at_ckpt.duplicated == [],
        f"after both restarts, at the checkpoint of cycle {ckpt['global_steps']}: admitted {len(at_ckpt.admitted)}, "
        f"trained {len(at_ckpt.trained)}, held {len(at_ckpt.left)}, dropped stale {len(at_ckpt.dropped)}, "
        f"lost {len(at_ckpt.lost)}, duplicated {len(at_ckpt.duplicated)}",
    )

    # Read now: the resumed run keeps only the newest two checkpoints, so this one goes.
    opt_steps_at_ckpt = optimizer_steps(latest_checkpoint_dir())
    t1 = time.monotonic()
    steps = ckpt["global_steps"] + RESUMED
    with (OUT / "run2.log").open("w") as log:
        resumed = subprocess.run([*COMMAND, "--resume", str(RUN), "--steps", str(steps), *SETS], stdout=log, stderr=log)
    print(f"resumed run took {time.monotonic() - t1:.0f} s", flush=True)
    check(resumed.returncode == 0, f"the resumed run completed (status {resumed.returncode}; log {OUT}/run2.log)")
    if resumed.returncode != 0:
        return
    report_checks(ckpt, steps, engines_start_s, opt_steps_at_ckpt)


def ledger_at(ckpt: dict) -> SampleLedger:
    """The run's samples as checkpoint ``ckpt`` saw them: the ledger lines it counted, what it held."""
    lines = read_ledger(RUN / "ledger.jsonl")[: ckpt["ledger_lines"]]
    return SampleLedger(
        admitted=[f"s{k}" for k in range(ckpt["prompts"]["position"])],
        trained=[x["sample_id"] for x in lines],
        left=checkpoint_sample_ids(ckpt),
        dropped=ckpt["dropped"],
    )


def restart_limit_s(engines_start_s: float) -> float:
    """Seconds a killed replica may take to serve again in a run whose engines first started in
    ``engines_start_s`` seconds (see RESTART_PER_START)."""
    return max(RESTART_LIMIT_S, RESTART_PER_START * engines_start_s)


def report_checks(ckpt: dict, steps: int, engines_start_s: float, opt_steps_at_ckpt: int) -> None:
    recs = records()
    limit = restart_limit_s(engines_start_s)
    report = json.loads((RUN / "report.json").read_text())
    audit = audit_run_folder(RUN)
    restarts = {r["replica"]: r for r in ckpt["replica_restarts"]}
    for rid in ("standalone-1", "hybrid-0"):
        r = restarts.get(rid)
        back = r and r["seconds_to_return"]
        check(
            back is not None and back <= limit,
            f"{rid} killed in cycle {r and r['cycle']}, back in {back or float('nan'):.1f} s "
            f"(limit {limit:.0f} s: the larger of {RESTART_LIMIT_S:.0f} s and "
            f"{RESTART_PER_START:g} x the engines' first start); of it the engine's rebuild "
            f"{(r and r.get('rebuild_s')) or float('nan'):.1f} s, attempts {r and r['attempts']}",
        )
        outside = back - r["rebuild_s"] if back is not None and r.get("rebuild_s") is not None else None
        check(
            outside is not None and outside <= OUTSIDE_REBUILD_S,
            f"{rid}: {outside if outside is not None else float('nan'):.1f} s of its return outside the rebuild "
            f"(backoff, health probe, weight load; limit {OUTSIDE_REBUILD_S:.0f} s)",
        )
    check(not report["quarantined"], f"no replica quarantined ({report['quarantined']})")
    check([r["step"] for r in recs] == list(range(1, steps + 1)), f"metrics.jsonl has cycles 1..{steps} once each")
    check(
        report["weight_version"] == steps and report["cycles"][0]["step"] == ckpt["global_steps"] + 1,
        f"weight_version goes on: resumed at cycle {report['cycles'][0]['step']}, ends at {report['weight_version']}",
    )
    check(
        audit.lost == 0 and audit.duplicated == 0 and audit.segments == 2,
        f"ledger over {audit.segments} segments: admitted {audit.admitted}, trained {audit.trained}, held "
        f"{audit.held}, dropped stale {audit.dropped}, lost {audit.lost}, duplicated {audit.duplicated}",
    )
    s = report["samples"]
    check(
        s["failed"] == 0 and s["duplicates"] == 0,
        f"resumed segment: failed {s['failed']}, duplicates {s['duplicates']}",
    )
    at = ckpt["global_steps"]
    rewards = [r[KEY] for r in recs]
    first = sum(rewards[:3]) / 3
    at_ckpt = sum(rewards[at - 2 : at]) / 2
    resumed_start = sum(rewards[at : at + 2]) / 2
    resumed_all = rewards[at:]
    last = sum(resumed_all) / len(resumed_all)
    print(
        f"reward: first 3 cycles {first:.3f}; cycles {at - 1}-{at} before the checkpoint {at_ckpt:.3f}; "
        f"first 2 resumed cycles {resumed_start:.3f}; all {len(resumed_all)} resumed cycles {last:.3f}",
        flush=True,
    )
    steps_after = optimizer_steps(latest_checkpoint_dir())
    per_cycle = opt_steps_at_ckpt / at
    check(
        steps_after == per_cycle * steps,
        f"the trainer's AdamW state went on from the checkpoint: {opt_steps_at_ckpt} steps at cycle {at}, "
        f"{steps_after} at cycle {steps} (from scratch: {per_cycle * RESUMED:g})",
    )
    if at_ckpt > first + LEARNED:
        # Nearer the checkpoint's reward than the run's first cycles' (a fresh model's): single cycles
        # of the toy task swing by 0.1 and more (0.98 at a checkpoint, 0.85 in the first resumed cycles).
        check(
            resumed_start > (first + at_ckpt) / 2,
            "the resumed run starts from the checkpoint's reward, not from scratch",
        )
        check(last > first + 0.05, "the reward keeps rising after the resume")
    else:
        # The toy task has an absorbing state: once every response of a group earns the same reward
        # (a constant answer scores 0.5), GRPO's advantages are 0 and training stops moving. Runs
        # fall into it now and then, killed replicas or not (docs/real-runs.md); then there is no
        # rise to keep, and a fresh model's reward is as near the checkpoint's as a resumed one's (a
        # clean-clone CI run failed the continuity check so), so only the optimizer's state above says
        # the resume went on from the checkpoint.
        print(
            f"note: the model had not learned by the checkpoint ({at_ckpt:.3f} vs {first:.3f} in the first "
            "cycles), so the reward's continuity and rise after the resume are not checked in this run",
            flush=True,
        )


if __name__ == "__main__":
    main()
    sys.exit(1 if failures else 0)
