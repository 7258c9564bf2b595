"""Runtime benchmark: deactivation scaling, routing throughput, event-loop lag under load.

Run: ``.venv/bin/python benchmarks/runtime_bench.py`` (about 15 s on 2 cores). Prints each figure
with its target and PASS/FAIL; exits 1 if any target is missed. Real time is measured here on
purpose (this is a benchmark, not runtime code).

1. Deactivation time of 1, 8 and 64 fake hybrid replicas whose every operation takes 100 ms
   (remove from routing, abort + drain, sleep, trainer onload); target: 64 replicas within 1.2x
   of 1 replica (operations run concurrently).
2. Load-balancer routing decisions per second with 10,000 requests in flight on 64 replicas,
   sticky sessions on (each decision = route one new request + release one finished request);
   target >= 100,000/s.
3. Largest event-loop lag while 8 hybrid replicas are deactivated with 10,000 requests in flight
   on 16 replicas (the aborted requests are retried on the standalone replicas); target < 10 ms.
   The benchmark never touches the garbage collector itself; it takes the runtime's start-up
   step (``run_gc_control``), as every run does.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from typing import Any

from dynres.runtime.backends.fake import FakeReplica, FakeTrainEngine
from dynres.runtime.loop.controller import Controller
from dynres.runtime.loop.gc_control import run_gc_control
from dynres.runtime.loop.ops import OpRunner
from dynres.runtime.loop.routing import LoadBalancer
from dynres.runtime.protocols import GenerationRequest, WeightUpdate

OP_LATENCY_S = 0.1


def _controller(lb: LoadBalancer, hybrid: list[FakeReplica], engine: FakeTrainEngine) -> Controller:
    loop = asyncio.get_running_loop()
    return Controller(
        balancer=lb,
        train_engine=engine,
        hybrid=hybrid,
        ops=OpRunner(timeout_s=60.0, now=loop.time),
        now=loop.time,
    )


async def deactivation_time(n: int) -> float:
    """Seconds one deactivation of ``n`` hybrid replicas takes (real loop, 100 ms per op)."""
    lat = {op: OP_LATENCY_S for op in ("abort", "sleep", "wake_up", "update_weights", "resume", "pause")}
    hybrid = [FakeReplica(f"h{i}", "hybrid", latency=lat, log_generate=False) for i in range(n)]
    engine = FakeTrainEngine(latency=OP_LATENCY_S)
    lb = LoadBalancer()
    ctl = _controller(lb, hybrid, engine)
    await ctl.activate(WeightUpdate(1))
    t0 = time.perf_counter()
    await ctl.deactivate()
    return time.perf_counter() - t0


def routing_rate(in_flight: int = 10_000, replicas: int = 64, decisions: int = 300_000) -> float:
    """Routing decisions per second with ``in_flight`` requests running."""
    lb = LoadBalancer(seed=1, sticky_capacity=100_000)
    for i in range(replicas):
        lb.add_replica(FakeReplica(f"r{i}", log_generate=False))
    running = [f"w{i}" for i in range(in_flight)]
    for rid in running:
        lb.route(rid)
    rng = random.Random(7)
    picks = [rng.randrange(in_flight) for _ in range(decisions)]
    new_ids = [f"n{i}" for i in range(decisions)]
    route, release = lb.route, lb.release
    t0 = time.perf_counter()
    for k in range(decisions):
        j = picks[k]
        release(running[j])
        rid = new_ids[k]
        route(rid)
        running[j] = rid
    dt = time.perf_counter() - t0
    lb.check_invariants()
    return decisions / dt


async def lag_during_deactivation(
    in_flight: int = 10_000, n_standalone: int = 8, n_hybrid: int = 8
) -> tuple[float, float, int]:
    """(largest loop lag in s, deactivation time in s, requests moved) under ``in_flight`` load.

    The window runs from the deactivation's start until every aborted request runs again on a
    standalone replica. The benchmark does nothing to the garbage collector: ``main`` takes the
    runtime's own start-up step (:func:`~dynres.runtime.loop.gc_control.run_gc_control`), as every
    run does.
    """
    lat = {op: OP_LATENCY_S for op in ("abort", "sleep", "wake_up", "update_weights", "resume", "pause")}
    kw: dict[str, Any] = {"tokens_per_s": 20.0, "response_tokens": 1000, "log_generate": False}
    standalone = [FakeReplica(f"s{i}", latency=lat, **kw) for i in range(n_standalone)]
    hybrid = [FakeReplica(f"h{i}", "hybrid", latency=lat, **kw) for i in range(n_hybrid)]
    engine = FakeTrainEngine(latency=OP_LATENCY_S)
    lb = LoadBalancer(seed=3)
    for r in standalone:
        lb.add_replica(r)
    ctl = _controller(lb, hybrid, engine)
    await ctl.activate(WeightUpdate(1))
    tasks = [
        asyncio.create_task(lb.generate(GenerationRequest(f"q{i}", f"q{i}", range(8), 2000))) for i in range(in_flight)
    ]
    while lb.total_in_flight < in_flight:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)
    moved = sum(lb.in_flight(h.replica_id) for h in hybrid)

    lags: list[float] = []
    stop = False

    async def monitor() -> None:
        period = 0.001
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(period)
            lags.append(time.perf_counter() - t - period)

    mon = asyncio.create_task(monitor())
    await asyncio.sleep(0.05)
    lags.clear()
    t0 = time.perf_counter()
    await ctl.deactivate()
    dt = time.perf_counter() - t0
    # The re-queue of the aborted requests continues after the deactivation returns.
    while lb.requeue_pending or any(lb.in_flight(h.replica_id) for h in hybrid):
        await asyncio.sleep(0.005)
    stop = True
    await mon
    assert lb.total_in_flight == in_flight, "a request was lost during deactivation"
    lb.start_draining()  # first, so the aborts below end the requests instead of moving them
    for r in standalone:
        await r.abort(None)
    await asyncio.gather(*tasks)
    return max(lags), dt, moved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of the timing runs (median)")
    args = parser.parse_args()
    ok = True

    def verdict(good: bool) -> str:
        nonlocal ok
        ok &= good
        return "PASS" if good else "FAIL"

    print("dynres runtime benchmark")
    print(f"Python {sys.version.split()[0]}, fake replica ops take {OP_LATENCY_S * 1000:.0f} ms each")
    print()
    times = {n: statistics.median(asyncio.run(deactivation_time(n)) for _ in range(args.repeat)) for n in (1, 8, 64)}
    for n, t in times.items():
        print(f"deactivation, {n:>2} hybrid replicas: {t * 1000:7.1f} ms")
    ratio = times[64] / times[1]
    print(f"  64 vs 1 replica: {ratio:.3f}x   target <= 1.2x   {verdict(ratio <= 1.2)}")
    print()
    rate = statistics.median(routing_rate() for _ in range(args.repeat))
    print(
        f"routing, 10,000 in flight on 64 replicas: {rate:,.0f} decisions/s   target >= 100,000/s   "
        f"{verdict(rate >= 100_000)}"
    )
    print()
    with run_gc_control():  # the runtime's start-up GC step, exactly what a run takes
        lag, dt, moved = asyncio.run(lag_during_deactivation())
    print(
        f"deactivation under load (10,000 in flight, 8 standalone + 8 hybrid, {moved} requests moved): "
        f"{dt * 1000:.1f} ms"
    )
    print(f"  largest event-loop lag: {lag * 1000:.2f} ms   target < 10 ms   {verdict(lag < 0.010)}")
    print()
    print("ALL PASS" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
