"""Control-plane scale benchmark: routing, loop lag, deactivation and memory at up to 512 + 512 replicas.

Run: ``.venv/bin/python benchmarks/scale_bench.py`` (a few minutes on 2 busy cores; ``--quick``
runs only the smallest size). Every size runs in a fresh subprocess on a real asyncio loop with
fake replicas (``FakeReplica``, 100 ms per lifecycle operation), so each row starts from the same
interpreter state and its memory figure is not blurred by earlier sizes. ``--size S+H`` and
``--load N`` pick rows; ``--probe-ms X`` lists, per window, the loop iterations above X ms with
the callbacks and collections that ran in them (and stops after the table: a probed run's lags
read a little high).

Real time is measured here on purpose (this is a benchmark, not runtime code). The benchmark
never touches the garbage collector: it calls :func:`dynres.runtime.loop.gc_control.run_gc_control`,
the same start-up step every run takes (``dynres run`` and ``dynres simulate`` both go through
``FullyAsyncRun.run``), and nothing else.

Per size (standalone + hybrid replicas, requests in flight) it measures:

* routing decisions/s: one decision = release one running request + route a new one (sticky on);
* the largest and p99 event-loop lag (a 1 ms sleeper's overshoot) during a deactivation of all
  hybrid replicas, until every aborted request runs again on a standalone replica, and during an
  activation followed by a rebalance, until every moved request runs again;
* the deactivation's duration;
* coordinator memory per in-flight request (RSS growth while the load is built, divided by the
  requests; fake replicas' per-request state included, so it is an upper bound).

Then ``deact_512_vs_1``: the 512 + 512 deactivation under its load against 1 + 1 replica with the
same requests per replica, and ``sim_512_s``: the CPU seconds (one core) of a 20-cycle simulation
of ``verl-7b-async-16-16`` scaled to 512 + 512 GPUs with dynamic scheduling on. The last line is
the key=value summary of issue 15.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

OP_LATENCY_S = 0.1
SIZES = ((16, 16), (128, 128), (512, 512))
LOADS = (10_000, 100_000)
ROUTING_DECISIONS = 200_000

TARGETS = {
    "routing_per_s": (">=", 100_000.0),
    "lag_max_ms": ("<", 10.0),
    "deact_512_vs_1": ("<=", 1.5),
    "kb_per_request": ("<=", 8.0),
    "sim_512_s": ("<", 60.0),
}

SIM_OVERRIDES = {
    "steps": 20,
    "cluster.trainer_gpus": 512,
    "cluster.rollout_gpus": 512,
    "async_training.use_dynamic_resource_scheduling": True,
    "async_training.dynamic_schedule_policy": "default",
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _routing_rate(n_replicas: int, in_flight: int, decisions: int) -> float:
    """Decisions/s of release + route with ``in_flight`` requests on ``n_replicas`` replicas."""
    from runtime_bench import routing_rate  # the same measurement as runtime_bench, at these sizes

    return routing_rate(in_flight=in_flight, replicas=n_replicas, decisions=decisions)


class LagMonitor:
    """Event-loop lag: how late a 1 ms sleeper wakes up, in loop CPU time and in wall time.

    On a shared machine the wall-clock overshoot mostly measures the OS scheduler (the process
    waits for a core). The CPU figure is what the loop itself did past the deadline: the main
    thread's CPU time between falling asleep and waking, minus the period, i.e. the lag on a
    core of its own. Both are kept; the summary uses the CPU one and the table shows both.
    """

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self._stop = False
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        period = 0.001
        while not self._stop:
            t, c = time.perf_counter(), time.thread_time()
            await asyncio.sleep(period)
            self.wall.append(time.perf_counter() - t - period)
            self.cpu.append(max(0.0, time.thread_time() - c - period))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def window(self) -> None:
        self.cpu.clear()
        self.wall.clear()

    def summary(self) -> tuple[float, float, float]:
        """(largest CPU lag, p99 CPU lag, largest wall lag) of the current window (ms)."""
        if not self.cpu:
            return 0.0, 0.0, 0.0
        xs = sorted(self.cpu)
        return xs[-1] * 1000, xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000, max(self.wall) * 1000

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            await self._task


class IterationProbe:
    """Times every event-loop iteration (main thread's CPU) and every callback run in it.

    ``--probe-ms X`` attaches it: each window then lists its iterations above X ms with their
    heaviest callbacks (a task step is named by its coroutine and by what it was awaiting) and
    the garbage collections inside them. The patch is on this benchmark's loop and asyncio's
    Python ``Handle._run``; it adds ~1 us per callback, so the lags of a probed run read high.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold_ms: float) -> None:
        self.threshold_s = threshold_ms / 1000
        self.slow: list[dict[str, Any]] = []
        self._calls: dict[str, list[float]] = {}
        self._gc: list[float] = []
        self._gc_gens: list[int] = []
        self._gc_t0 = 0.0
        run_once = loop._run_once  # type: ignore[attr-defined]
        handle_run = asyncio.events.Handle._run
        probe = self

        def timed_run_once() -> None:
            probe._calls, probe._gc, probe._gc_gens = {}, [], []
            c0 = time.thread_time()
            run_once()
            dt = time.thread_time() - c0
            if dt > probe.threshold_s:
                top = sorted(probe._calls.items(), key=lambda kv: -kv[1][1])[:4]
                probe.slow.append(
                    {
                        "ms": round(dt * 1000, 2),
                        "callbacks": sum(int(v[0]) for v in probe._calls.values()),
                        "gc_ms": round(sum(probe._gc) * 1000, 2),
                        "gc_generations": list(probe._gc_gens),
                        "top": [f"{n:.0f} x {k}: {t * 1000:.2f} ms" for k, (n, t) in top],
                    }
                )

        def timed_handle_run(handle: asyncio.Handle) -> None:
            label = _label(handle)
            c0 = time.thread_time()
            handle_run(handle)
            entry = probe._calls.setdefault(label, [0.0, 0.0])
            entry[0] += 1
            entry[1] += time.thread_time() - c0

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                probe._gc_t0 = time.thread_time()
            else:
                probe._gc.append(time.thread_time() - probe._gc_t0)
                probe._gc_gens.append(info["generation"])

        # Profiling patches of asyncio's private internals (its stubs declare neither as assignable).
        loop._run_once = timed_run_once  # type: ignore[attr-defined]  # private BaseEventLoop method
        asyncio.events.Handle._run = timed_handle_run  # type: ignore[method-assign,assignment]  # replaces a method
        gc.callbacks.append(on_gc)

    def window(self) -> list[dict[str, Any]]:
        """The slow iterations since the last call (and forget them)."""
        out, self.slow = self.slow, []
        return out


def _label(handle: asyncio.Handle) -> str:
    """What a handle runs: a task step as 'coroutine <- awaited coroutine', else the callback's name."""
    cb = handle._callback  # type: ignore[attr-defined]
    task = getattr(cb, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro: Any = task.get_coro()
        name = getattr(coro, "__qualname__", repr(coro))
        inner = coro
        while getattr(inner, "cr_await", None) is not None and hasattr(inner.cr_await, "cr_await"):
            inner = inner.cr_await
        return f"step {name} <- {getattr(inner, '__qualname__', '?')}"
    target = getattr(cb, "func", cb)
    return getattr(target, "__qualname__", type(target).__name__)


async def _wait_until(cond: Any, timeout_s: float = 600.0) -> None:
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError("benchmark load did not settle")
        await asyncio.sleep(0.005)


async def _one_size(n_standalone: int, n_hybrid: int, in_flight: int, probe_ms: float = 0.0) -> dict[str, Any]:
    from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine
    from dynres.runtime.loop.controller import Controller
    from dynres.runtime.loop.ops import OpRunner
    from dynres.runtime.loop.routing import LoadBalancer
    from dynres.runtime.protocols import GenerationRequest, WeightUpdate

    loop = asyncio.get_running_loop()
    lat = {op: OP_LATENCY_S for op in ("abort", "sleep", "wake_up", "update_weights", "resume", "pause")}
    # Requests never finish inside the measured windows: 1000 tokens at 1 token/s.
    kw: dict[str, Any] = {"tokens_per_s": 1.0, "response_tokens": 1000, "log_generate": False, "latency": lat}
    standalone = [FakeReplica(f"s{i}", **kw) for i in range(n_standalone)]
    hybrid = [FakeReplica(f"h{i}", "hybrid", **kw) for i in range(n_hybrid)]
    engine = FakeTrainEngine(latency=OP_LATENCY_S)
    lb = LoadBalancer(seed=3)
    for r in standalone:
        lb.add_replica(r)
    ctl = Controller(
        balancer=lb, train_engine=engine, hybrid=hybrid, ops=OpRunner(timeout_s=600.0, now=loop.time), now=loop.time
    )
    await ctl.activate(WeightUpdate(1))

    def settled(gone: Any) -> bool:
        # Every request runs again, none waits to be handed back or retried, none is left on
        # the replicas in ``gone``.
        return (
            lb.total_in_flight == in_flight
            and not lb.requeue_pending
            and not any(lb.in_flight(r.replica_id) for r in gone)
        )

    rss0, objs0 = _rss_bytes(), len(gc.get_objects())
    prompt = range(8)
    tasks = [
        asyncio.create_task(lb.generate(GenerationRequest(f"q{i}", f"q{i}", prompt, 2000))) for i in range(in_flight)
    ]
    await _wait_until(lambda: lb.total_in_flight == in_flight)
    await asyncio.sleep(0.2)
    kb_per_request = (_rss_bytes() - rss0) / in_flight / 1024
    tracked_per_request = (len(gc.get_objects()) - objs0) / in_flight

    mon = LagMonitor()
    mon.start()
    probe = IterationProbe(loop, probe_ms) if probe_ms > 0 else None
    await asyncio.sleep(0.05)

    # Deactivation: cut routing, abort, drain, sleep, onload; then every aborted request runs
    # again on a standalone replica.
    moved_out = sum(lb.in_flight(h.replica_id) for h in hybrid)
    mon.window()
    t0, c0 = time.perf_counter(), time.thread_time()
    await ctl.deactivate()
    deact_s = time.perf_counter() - t0
    # The re-queue of the aborted requests may go on after the deactivation returned.
    await _wait_until(lambda: settled(hybrid))
    deact_cpu_s = time.thread_time() - c0
    deact_max, deact_p99, deact_wall = mon.summary()
    settle_deact_s = time.perf_counter() - t0
    deact_slow = probe.window() if probe else []

    await asyncio.sleep(0.05)
    mon.window()
    if probe:
        probe.window()
    t0, c0 = time.perf_counter(), time.thread_time()
    await ctl.activate(WeightUpdate(2))
    moved_in = await ctl.rebalance()
    await _wait_until(lambda: settled(()))
    act_s = time.perf_counter() - t0
    act_cpu_s = time.thread_time() - c0
    act_max, act_p99, act_wall = mon.summary()
    act_slow = probe.window() if probe else []
    await mon.stop()

    lb.start_draining()  # first, so the aborts below end the requests instead of moving them
    await asyncio.gather(*(r.abort(None) for r in [*standalone, *hybrid] if not r.sleeping))
    results = await asyncio.gather(*tasks)
    assert len(results) == in_flight and lb.counters.duplicates == 0, "a request was lost or duplicated"
    violations = [v for r in [*standalone, *hybrid] for v in r.violations]
    assert not violations, violations[:3]
    return {
        "standalone": n_standalone,
        "hybrid": n_hybrid,
        "in_flight": in_flight,
        "kb_per_request": kb_per_request,
        "tracked_per_request": tracked_per_request,
        "deact_cpu_s": deact_cpu_s,
        "act_cpu_s": act_cpu_s,
        "deact_s": deact_s,
        "deact_settle_s": settle_deact_s,
        "deact_moved": moved_out,
        "deact_lag_max_ms": deact_max,
        "deact_lag_p99_ms": deact_p99,
        "deact_lag_wall_ms": deact_wall,
        "act_s": act_s,
        "act_moved": moved_in,
        "act_lag_max_ms": act_max,
        "act_lag_p99_ms": act_p99,
        "act_lag_wall_ms": act_wall,
        "deact_slow": deact_slow,
        "act_slow": act_slow,
    }


def child_size(
    n_standalone: int, n_hybrid: int, in_flight: int, routing: bool, probe_ms: float = 0.0
) -> dict[str, Any]:
    """One size in this (fresh) process: the runtime's start-up GC step, routing, then the load."""
    from dynres.runtime.loop.gc_control import run_gc_control

    with run_gc_control():
        out = asyncio.run(_one_size(n_standalone, n_hybrid, in_flight, probe_ms))
        if routing:
            out["routing_per_s"] = _routing_rate(n_standalone + n_hybrid, in_flight, ROUTING_DECISIONS)
    return out


def child_sim() -> dict[str, Any]:
    """CPU and wall seconds of the 20-cycle 512 + 512 simulation (this process, one core)."""
    from dynres.runtime.sim import simulate

    c0, t0 = time.process_time(), time.perf_counter()
    r = simulate("verl-7b-async-16-16", overrides=SIM_OVERRIDES)
    return {
        "sim_cpu_s": time.process_time() - c0,
        "sim_wall_s": time.perf_counter() - t0,
        "sim_samples": r.report.samples.admitted,
        "sim_switches": r.switches,
        "sim_hours": r.end_to_end_s / 3600,
    }


def _row_lag(r: dict[str, Any]) -> float:
    """The largest lag of a row, deactivation or activation + rebalance (ms)."""
    return max(r["deact_lag_max_ms"], r["act_lag_max_ms"])


def _model(rows: list[dict[str, Any]]) -> None:
    """docs/scaling.md's model, fitted on three rows, against every row and at saturation.

    The lag monitor's overshoot spans about two loop iterations, and the heaviest iteration of
    a transition carries at most ``retry_batch`` hand-backs and retries (``c_move`` each), the
    starts or replies of at most ``fanout`` lifecycle calls (``c_op`` each), and the rebuild of
    one per-request shard (``N / 64`` entries, ``c_dict`` each):
    ``lag ~ 2 x (retry_batch x c_move + min(H, fanout) x c_op + N / 64 x c_dict)``.
    """
    from dynres.runtime.loop.ops import OpRunner
    from dynres.runtime.loop.routing import LoadBalancer
    from dynres.runtime.loop.routing.shards import SHARDS as _SHARDS

    rb = LoadBalancer().retry_batch
    fanout = OpRunner(timeout_s=1.0, now=float).fanout
    by = {(r["hybrid"], r["in_flight"]): r for r in rows}
    move_fit = by.get((16, min(LOADS)), rows[0])
    op_fit = by.get((512, min(LOADS)), rows[-1])
    dict_fit = by.get((16, max(LOADS)), rows[-1])
    c_move = (move_fit["deact_cpu_s"] + move_fit["act_cpu_s"]) / (move_fit["deact_moved"] + move_fit["act_moved"])
    base = rb * c_move * 1000  # ms
    c_op = max(0.0, _row_lag(op_fit) / 2 - base) / min(op_fit["hybrid"], fanout)  # ms
    c_dict = max(1e-6, _row_lag(dict_fit) / 2 - base - min(dict_fit["hybrid"], fanout) * c_op) / (
        dict_fit["in_flight"] / _SHARDS
    )  # ms

    def model(h: int, n: int) -> float:
        return 2 * (base + min(h, fanout) * c_op + n / _SHARDS * c_dict)

    print()
    print(
        f"model (docs/scaling.md): largest lag ~ 2 x (retry_batch x c_move + min(H, fanout) x c_op + N / {_SHARDS} x "
        f"c_dict), retry_batch = {rb}, fanout = {fanout}, c_move = {c_move * 1e6:.0f} us (CPU per moved request, "
        f"{move_fit['standalone']}+{move_fit['hybrid']}), c_op = {c_op * 1000:.0f} us (fitted at "
        f"{op_fit['standalone']}+{op_fit['hybrid']}, {op_fit['in_flight']:,}), c_dict = {c_dict * 1e6:.0f} ns "
        f"(fitted at {dict_fit['standalone']}+{dict_fit['hybrid']}, {dict_fit['in_flight']:,})"
    )
    print(f"{'S+H':>9s} {'in flight':>9s} | {'lag ms model':>12s} {'measured':>8s}")
    for r in rows:
        size = f"{r['standalone']}+{r['hybrid']}"
        print(f"{size:>9s} {r['in_flight']:9,d} | {model(r['hybrid'], r['in_flight']):12.1f} {_row_lag(r):8.1f}")
    room = 5.0 - base - fanout * c_op  # ms of one iteration left for the shard rebuild
    n_star = room / c_dict * _SHARDS if room > 0 else 0.0
    print(
        f"saturation (largest lag reaches 10 ms): model N = {n_star:,.0f} requests in flight at any H >= {fanout} "
        f"(H alone no longer saturates it: at most {fanout} calls start per iteration); measured: "
        f"{_crossing([(r['in_flight'], _row_lag(r)) for r in rows if r['hybrid'] == max(h for _, h in SIZES)], 10.0)}"
        " requests in flight at the largest size"
    )


def _crossing(points: list[tuple[int, float]], limit: float) -> str:
    """Where a series of (x, lag ms) crosses ``limit``, interpolated on log(x)."""
    import itertools
    import math

    for (h0, y0), (h1, y1) in itertools.pairwise(points):
        if y0 <= limit < y1:
            f = (limit - y0) / (y1 - y0)
            return f"{math.exp(math.log(h0) + f * (math.log(h1) - math.log(h0))):.0f} (between {h0} and {h1})"
    if points and points[0][1] > limit:
        return f"below {points[0][0]} (already {points[0][1]:.1f} ms there)"
    return f"above {points[-1][0]}" if points else "n/a"


def _spawn(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True, env=os.environ.copy()
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _verdict(key: str, value: float) -> str:
    op, target = TARGETS[key]
    ok = {"<": value < target, "<=": value <= target, ">=": value >= target}[op]
    return f"{key}={value:.4g} (target {op} {target:g}: {'PASS' if ok else 'FAIL'})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only 16 + 16 replicas, no simulation")
    ap.add_argument(
        "--size", action="append", metavar="S+H", help="only this size (repeatable, e.g. --size 512+512); no simulation"
    )
    ap.add_argument(
        "--probe-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="list the loop iterations above MS ms of each window and what ran in them (slows the run a little)",
    )
    ap.add_argument("--load", type=int, action="append", help="only this many requests in flight (repeatable)")
    ap.add_argument("--child", nargs=3, type=int, metavar=("S", "H", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--no-routing", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-sim", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        n_standalone, n_hybrid, in_flight = args.child
        result = child_size(n_standalone, n_hybrid, in_flight, routing=not args.no_routing, probe_ms=args.probe_ms)
        print(json.dumps(result))
        return 0
    if args.child_sim:
        print(json.dumps(child_sim()))
        return 0

    print("dynres control-plane scale benchmark")
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores visible, load average {os.getloadavg()}")
    print(f"fake replica lifecycle ops take {OP_LATENCY_S * 1000:.0f} ms; lags are a 1 ms sleeper's overshoot")
    print()
    head = (
        f"{'S+H':>9s} {'in flight':>9s} {'route/s':>9s} {'KiB/req':>7s} | {'deact ms':>8s} {'moved':>6s} "
        f"{'lag max':>7s} {'p99':>5s} | {'act+reb ms':>10s} {'moved':>6s} {'lag max':>7s} {'p99':>5s}"
    )
    print(head)
    print("-" * len(head))
    sizes: tuple[tuple[int, int], ...] = SIZES[:1] if args.quick else SIZES
    if args.size:
        wanted = {tuple(int(x) for x in sz.split("+")) for sz in args.size}
        sizes = tuple(sz for sz in SIZES if sz in wanted)
        if not sizes:
            ap.error(f"--size: pick from {', '.join(f'{s}+{h}' for s, h in SIZES)}")
    rows = []
    loads = tuple(n for n in LOADS if not args.load or n in args.load) or tuple(args.load)
    for s, h in sizes:
        for n in loads:
            row = _spawn(["--child", str(s), str(h), str(n), "--probe-ms", str(args.probe_ms)])
            rows.append(row)
            print(
                f"{f'{s}+{h}':>9s} {n:9,d} {row['routing_per_s']:9,.0f} {row['kb_per_request']:7.2f} | "
                f"{row['deact_s'] * 1000:8.0f} {row['deact_moved']:6d} {row['deact_lag_max_ms']:7.2f} "
                f"{row['deact_lag_p99_ms']:5.2f} | {row['act_s'] * 1000:10.0f} {row['act_moved']:6d} "
                f"{row['act_lag_max_ms']:7.2f} {row['act_lag_p99_ms']:5.2f}",
                flush=True,
            )
            for phase in ("deact", "act"):
                for it in row[f"{phase}_slow"]:
                    print(
                        f"    {phase} iteration {it['ms']} ms, {it['callbacks']} callbacks, gc {it['gc_ms']} ms "
                        f"(generations {it['gc_generations']}): " + "; ".join(it["top"])
                    )
    if args.probe_ms:
        return 0  # a probed run's lags read high (see IterationProbe): no summary from it
    from runtime_bench import routing_rate  # same directory

    ref = statistics.median(routing_rate(decisions=100_000) for _ in range(3))
    print(
        f"machine speed now: runtime_bench's routing (10,000 in flight, 64 replicas) runs "
        f"{ref:,.0f} decisions/s here; issue 15 measured 193,000-279,000 on a quiet 2-core machine"
    )
    print()
    big = rows[-1]
    per_replica = big["in_flight"] // (big["standalone"] + big["hybrid"])
    one = _spawn(["--child", "1", "1", str(2 * per_replica), "--no-routing"])
    ratio = big["deact_s"] / one["deact_s"]
    print(
        f"deactivation {big['hybrid']} vs 1 hybrid replica ({per_replica} requests per replica): "
        f"{big['deact_s'] * 1000:.0f} ms vs {one['deact_s'] * 1000:.0f} ms = {ratio:.2f}x"
    )
    from runtime_bench import deactivation_time  # same directory: the idle case, ops only

    idle = {n: statistics.median(asyncio.run(deactivation_time(n)) for _ in range(3)) for n in (1, big["hybrid"])}
    print(
        f"  for information, with nothing in flight: {idle[big['hybrid']] * 1000:.0f} ms vs {idle[1] * 1000:.0f} ms "
        f"= {idle[big['hybrid']] / idle[1]:.2f}x (the operations themselves run concurrently)"
    )
    _model(rows)
    summary = {
        "routing_per_s": big["routing_per_s"],
        "lag_max_ms": max(max(r["deact_lag_max_ms"], r["act_lag_max_ms"]) for r in rows),
        "lag_p99_ms": max(max(r["deact_lag_p99_ms"], r["act_lag_p99_ms"]) for r in rows),
        "deact_512_vs_1": ratio,
    }
    # Memory per request is read at the largest load run (small loads are dominated by the
    # interpreter's own growth); a --load that leaves it out has no such figure.
    heavy = [r["kb_per_request"] for r in rows if r["in_flight"] == max(LOADS)]
    if heavy:
        summary["kb_per_request"] = max(heavy)
    if not args.quick and not args.size:
        sim = _spawn(["--child-sim"])
        summary["sim_512_s"] = sim["sim_cpu_s"]
        print(
            f"simulation 512+512, 20 cycles: {sim['sim_cpu_s']:.1f} s CPU ({sim['sim_wall_s']:.1f} s wall), "
            f"{sim['sim_samples']} samples, {sim['sim_switches']} switches, {sim['sim_hours']:.1f} simulated hours"
        )
    print()
    for key, value in summary.items():
        if key in TARGETS:
            print(_verdict(key, value))
    print(f"load average at the end: {os.getloadavg()}")
    print(" ".join(f"{k}={v:.4g}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
