"""Simulator speed: simulated seconds per wall second, and the wall time of the three seed runs.

    .venv/bin/python benchmarks/sim_bench.py [--repeat N] [--preset NAME ...]

Runs each preset in this process (one core), after one short warm-up run so that imports and
first-use costs are not counted. The seed set (seed-dynamic-16-16, seed-static-16-16,
seed-static-8-24) should take well under 30 s of wall time together.
"""

from __future__ import annotations

import argparse
import os
import time

SEED = ("seed-dynamic-16-16", "seed-static-16-16", "seed-static-8-24")


def main() -> None:
    """Parse arguments, run the presets, print one line per run and the seed total."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="preset to time (default: the three seed presets)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per preset; the fastest is reported")
    args = ap.parse_args()
    presets = tuple(args.preset or SEED)

    from dynres.runtime.sim import simulate

    simulate("seed-dynamic-16-16", overrides={"steps": 1})  # warm-up: imports, first-use caches
    cpu0 = time.process_time()
    total_wall = 0.0
    print(f"{'preset':24s} {'steps':>5s} {'simulated':>11s} {'wall':>8s} {'sim s / wall s':>15s} {'requests':>9s}")
    for name in presets:
        best = None
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            r = simulate(name)
            wall = time.perf_counter() - t0
            best = (wall, r) if best is None or wall < best[0] else best
        assert best is not None
        wall, r = best
        total_wall += wall
        requests = r.report.samples.admitted * r.scenario.responses_per_sample
        print(
            f"{name:24s} {r.scenario.steps:5d} {r.end_to_end_s / 3600:9.3f} h {wall:7.2f}s "
            f"{r.end_to_end_s / wall:15.0f} {requests:9d}"
        )
    cpu = time.process_time() - cpu0
    print(
        f"total wall {total_wall:.2f} s for {len(presets)} runs "
        f"(process CPU {cpu:.2f} s, {os.cpu_count()} cores visible)"
    )


if __name__ == "__main__":
    main()
