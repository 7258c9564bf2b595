"""Fault table: each fault of issue 12, run on fakes, counted by sample identity.

Run: ``.venv/bin/python benchmarks/fault_table.py`` (about 30 s on 2 cores). For each fault it
prints whether the run finished its cycles, how many admitted samples were lost (never trained,
not left queued, not left partial, not dropped as stale), how many were trained more than once,
and whether the report (or the error raised) names the fault. Samples are followed by id: the
prompt source records what was admitted, the fake trainer records what it trained; the run's own
counters are not used. Every run is on a virtual-time loop with a 2-second deadlock detector and
a virtual-time cap, so a hang shows as ``hang`` instead of blocking the script.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dynres.core import Policy, get_plugin_manager, load_config, load_policy
from dynres.core.config import DynresConfig
from dynres.core.errors import BackendError
from dynres.runtime.backends.fake import FakeCluster, fake_prompts
from dynres.runtime.loop.driver import FullyAsyncRun, RunSpec
from dynres.runtime.loop.ledger import SampleLedger, held_sample_ids
from dynres.runtime.protocols import GenerationRequest
from dynres.runtime.samples import PromptGroup
from dynres.runtime.sim.virtual_time import run_virtual

VIRTUAL_CAP_S = 3600.0


def config(staleness: float = 0.5, trigger: int = 1, mini: int = 3) -> DynresConfig:
    """2 standalone + 2 hybrid GPUs, ``mini`` samples per step."""
    return load_config(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": trigger,
                "staleness_threshold": staleness,
                "concurrent_samples_per_replica": 2,
            },
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": mini}, "rollout": {"n": 2}},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 2},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2},
        }
    )


class Recorder:
    """A prompt source that remembers every group it handed out."""

    def __init__(self, source: Iterator[PromptGroup]) -> None:
        self.source = source
        self.admitted: list[str] = []

    def __iter__(self) -> Iterator[PromptGroup]:
        for g in self.source:
            self.admitted.append(g.sample_id)
            yield g


@dataclass
class Outcome:
    """One fault's row."""

    fault: str
    finished: str
    lost: int
    duplicated: int
    reported: str


def _ids_trained(cluster: FakeCluster) -> list[str]:
    return [s.sample_id for b in cluster.engine.batches for s in b]


def account(
    run: FullyAsyncRun, rec: Recorder, trained: list[str], checkpoint: dict[str, Any] | None = None
) -> tuple[int, int]:
    """(lost, duplicated) by identity; the samples in ``checkpoint`` (default: the one of a failed
    run's report) count as kept."""
    if checkpoint is None:
        checkpoint = getattr(getattr(run, "_error_report", None), "checkpoint", None)
    # A sample dropped as too stale is accounted for: the rollouter admitted a replacement.
    ledger = SampleLedger(rec.admitted, trained, held_sample_ids(run, checkpoint), run.queue.dropped_ids)
    return len(ledger.lost), len(ledger.duplicated)


def _spec(cl: FakeCluster, rec: Recorder, cfg: DynresConfig, policy: Any = None, **kw: Any) -> RunSpec:
    kw.setdefault("num_cycles", 4)
    return RunSpec(
        config=cfg,
        policy=policy or load_policy("default", {"deactivate_ratio": 0.5}),
        standalone=cl.standalone,
        hybrid=cl.hybrid,
        train_engine=cl.engine,
        prompts=rec,
        plugin_manager=get_plugin_manager(load_plugins=False),
        **kw,
    )


def execute(run: FullyAsyncRun) -> tuple[str, Any, BaseException | None]:
    """Run on a virtual loop; return (how it ended, report or None, error or None)."""

    async def main() -> Any:
        return await asyncio.wait_for(run.run(), VIRTUAL_CAP_S)

    try:
        report = run_virtual(main, idle_timeout_s=2.0, thread_grace_s=1.0)
    except TimeoutError as exc:
        if not isinstance(exc, BackendError):
            return "hang", None, exc
        return f"raised {type(exc).__name__}", getattr(exc, "report", None), exc
    except BaseException as exc:  # the table reports whatever came out
        run._error_report = getattr(exc, "report", None)  # type: ignore[attr-defined]  # read by account()
        if "deadlocked" in str(exc):
            return "deadlock", None, exc
        return f"raised {type(exc).__name__}", getattr(exc, "report", None), exc
    return ("ok" if not report.stopped_early else "stopped early"), report, None


def _reported(report: Any, exc: BaseException | None, needle: Callable[[Any], bool]) -> str:
    if report is None:
        return "error only" if exc is not None else "no"
    return "yes" if needle(report) else "no"


def fault_generate_runtime_error(staleness: float) -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=400, response_tokens=20, latency=0.002)
    cl.standalone[0].generate_fault = lambda r: RuntimeError("actor died (not a BackendError)")
    rec = Recorder(fake_prompts(n=2))
    run = FullyAsyncRun(_spec(cl, rec, config(staleness=staleness)))
    how, report, exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    rep = _reported(report, exc, lambda r: "s0" in r.quarantined or any(f.target == "s0" for f in r.op_failures))
    return Outcome(f"generate raises RuntimeError (staleness {staleness:g})", how, lost, dup, rep)


def fault_train_step(kind: str) -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=400, response_tokens=20, latency=0.002)
    calls = {"n": 0}
    inner = cl.engine.train_step

    async def train_step(batch: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            if kind == "raise":
                raise RuntimeError("CUDA error: an illegal memory access")
            await asyncio.Event().wait()
        return await inner(batch)

    cl.engine.train_step = train_step  # type: ignore[method-assign]
    rec = Recorder(fake_prompts(n=2))
    run = FullyAsyncRun(_spec(cl, rec, config(), op_timeout_s=30.0, keep_checkpoint=True))
    how, report, exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl), report.checkpoint if report is not None else None)
    rep = _reported(report, exc, lambda r: any(f.op == "train_step" for f in r.op_failures))
    return Outcome(f"train_step {'raises once' if kind == 'raise' else 'hangs once'}", how, lost, dup, rep)


def fault_midrun_checkpoint() -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=200, response_tokens=40, latency=0.002)
    rec = Recorder(fake_prompts(n=2))
    at_ckpt: dict[str, Any] = {}
    run = FullyAsyncRun(_spec(cl, rec, config(), num_cycles=4))

    def progress(c: Any) -> None:
        if c.step == 2:
            at_ckpt["ckpt"] = run.checkpoint()
            at_ckpt["admitted"] = list(rec.admitted)
            at_ckpt["trained"] = _ids_trained(cl)

    run.spec.progress = progress
    how, _report, _exc = execute(run)
    ckpt = at_ckpt["ckpt"]
    # The process dies after cycle 2; a new one resumes from the checkpoint with the same prompt
    # stream, skipping what the checkpoint says was already read (old checkpoints do not say).
    start = int(ckpt.get("prompts", {}).get("position", 0))
    src = fake_prompts(n=2)
    for _ in range(start):
        next(src)
    cl2 = FakeCluster(2, 2, tokens_per_s=200, response_tokens=40, latency=0.002)
    rec2 = Recorder(src)
    run2 = FullyAsyncRun(_spec(cl2, rec2, config(), num_cycles=2, resume_from=ckpt))
    how2, _report2, _exc2 = execute(run2)
    trained = at_ckpt["trained"] + _ids_trained(cl2)
    done = set(trained)
    left = {s.sample_id for s in run2.queue.snapshot()} | {p.group.sample_id for p in run2.rollouter.partials}
    left |= set(run.queue.dropped_ids) | set(run2.queue.dropped_ids)
    admitted = list(dict.fromkeys(at_ckpt["admitted"] + rec2.admitted))
    lost = sum(1 for i in admitted if i not in done and i not in left)
    return Outcome(
        f"checkpoint after cycle 2 of 4, resume ({len(at_ckpt['admitted'])} admitted at checkpoint)",
        f"{how}/{how2}",
        lost,
        len(trained) - len(done),
        "n/a",
    )


_Default: type[Policy] = type(load_policy("default"))


class ExitingPolicy(_Default):  # type: ignore[valid-type,misc]
    """Calls sys.exit in its second should_activate_after_step."""

    name = "exiting"

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.n = 0

    def should_activate_after_step(self, ctx: Any) -> bool:
        self.n += 1
        if self.n == 3:
            raise SystemExit(3)
        return bool(super().should_activate_after_step(ctx))


class BadStatePolicy(_Default):  # type: ignore[valid-type,misc]
    """state_dict raises or returns something that is not JSON."""

    name = "badstate"
    mode = "raise"

    def state_dict(self) -> dict[str, Any]:
        if self.mode == "raise":
            raise ValueError("state broke")
        if self.mode == "set":
            return {"seen": {1, 2}}
        return {"ratio": math.nan}


def fault_policy_exit() -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=400, response_tokens=20, latency=0.002)
    rec = Recorder(fake_prompts(n=2))
    run = FullyAsyncRun(_spec(cl, rec, config(), policy=ExitingPolicy()))
    how, report, exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    in_flight = sum(len(r.in_flight_ids) for r in cl.replicas)
    return Outcome("policy raises SystemExit", f"{how}, {in_flight} running", lost, dup, _reported(report, exc, bool))


def fault_policy_state(mode: str) -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=400, response_tokens=20, latency=0.002)
    rec = Recorder(fake_prompts(n=2))
    pol = BadStatePolicy()
    pol.mode = mode
    run = FullyAsyncRun(_spec(cl, rec, config(), policy=pol, keep_checkpoint=True))
    how, report, exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    named = exc is not None and ("state_dict" in str(exc))
    if report is not None and report.checkpoint is not None:
        how += f", state={report.checkpoint['policy']['state']!r}"
    return Outcome(f"policy state_dict {mode}", how, lost, dup, "yes" if named else _reported(report, exc, bool))


def fault_transient() -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=400, response_tokens=20, latency=0.002)
    state = {"n": 0}

    def once(r: GenerationRequest) -> BaseException | None:
        state["n"] += 1
        return BackendError("transient hiccup") if state["n"] == 2 else None

    cl.standalone[0].generate_fault = once
    rec = Recorder(fake_prompts(n=2))
    run = FullyAsyncRun(_spec(cl, rec, config(), num_cycles=8, probation_backoff_s=0.01))
    how, report, exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    back = run.balancer.has_replica("s0")
    return Outcome(
        "one transient BackendError on s0", f"{how}, s0 back: {back}", lost, dup, _reported(report, exc, bool)
    )


def fault_abort(kind: str) -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=400, response_tokens=20, latency=0.002)
    if kind == "hang":
        cl.hybrid[0].hang_on.add("abort")
    else:
        cl.hybrid[0].fail_on["abort"] = BackendError("abort broke")
    rec = Recorder(fake_prompts(n=2))
    run = FullyAsyncRun(_spec(cl, rec, config(), num_cycles=4, op_timeout_s=20.0))
    how, report, _exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    n_abort = len(cl.hybrid[0].ops("abort"))
    q = report is not None and "h0" in report.quarantined
    return Outcome(f"abort {kind}s on h0", f"{how}, {n_abort} aborts tried", lost, dup, "quarantined" if q else "no")


def fault_livelock() -> Outcome:
    cl = FakeCluster(2, 2, tokens_per_s=100, latency=0.005, phase_times={"update_actor": 0.2})
    rec = Recorder(fake_prompts(n=2))
    run = FullyAsyncRun(_spec(cl, rec, config(), num_cycles=4))
    how, _report, _exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    return Outcome("FakeCluster(tokens_per_s=100, latency=5 ms)", how, lost, dup, "n/a")


def fault_stress(seed: int, n: int = 64, cycles: int = 20) -> Outcome:
    cl = FakeCluster(
        n, n, tokens_per_s=400, response_tokens=lambda r: 10 + zlib.crc32(r.request_id.encode()) % 30, latency=0.002
    )
    rng = random.Random(seed)
    for r in cl.replicas:
        r.generate_fault = lambda req: (
            BackendError("1% hiccup")
            if rng.random() < 0.01
            else (RuntimeError("rare actor error") if rng.random() < 1 / 3000 else None)
        )
    rec = Recorder(fake_prompts(n=2))
    cfg = load_config(
        {
            "async_training": {
                "use_dynamic_resource_scheduling": True,
                "trigger_parameter_sync_step": 1,
                "staleness_threshold": 0.5,
                "concurrent_samples_per_replica": 2,
            },
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 64}, "rollout": {"n": 2}},
            "rollout": {"nnodes": 1, "n_gpus_per_node": n},
            "trainer": {"nnodes": 1, "n_gpus_per_node": n},
        }
    )
    run = FullyAsyncRun(_spec(cl, rec, cfg, num_cycles=cycles, seed=seed))
    how, report, _exc = execute(run)
    lost, dup = account(run, rec, _ids_trained(cl))
    q = len(report.quarantined) if report is not None else -1
    return Outcome(
        f"{n}+{n} stress, 1% BackendError, RuntimeError 1/3000 (seed {seed})", how, lost, dup, f"{q} quarantined"
    )


FAULTS: dict[str, Callable[[], Outcome]] = {
    "gen-runtime": lambda: fault_generate_runtime_error(0.5),
    "gen-runtime-s0": lambda: fault_generate_runtime_error(0.0),
    "train-raise": lambda: fault_train_step("raise"),
    "train-hang": lambda: fault_train_step("hang"),
    "ckpt": fault_midrun_checkpoint,
    "policy-exit": fault_policy_exit,
    "state-raise": lambda: fault_policy_state("raise"),
    "state-set": lambda: fault_policy_state("set"),
    "state-nan": lambda: fault_policy_state("nan"),
    "transient": fault_transient,
    "abort-fail": lambda: fault_abort("fail"),
    "abort-hang": lambda: fault_abort("hang"),
    "livelock": fault_livelock,
    "stress": lambda: fault_stress(1),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("faults", nargs="*", help=f"subset of {list(FAULTS)}")
    args = ap.parse_args()
    rows = []
    for name in args.faults or FAULTS:
        try:
            row = FAULTS[name]()
        except BaseException as exc:  # the table reports a crashing harness row too
            row = Outcome(name, f"harness: {type(exc).__name__}: {str(exc)[:60]}", -1, -1, "?")
        rows.append(row)
        print(f"| {row.fault} | {row.finished} | {row.lost} | {row.duplicated} | {row.reported} |", flush=True)


if __name__ == "__main__":
    main()
