"""The virtual-time event loop: timers jump, thread work freezes the clock, hung threads time out."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dynres.core.errors import RuntimeStateError
from dynres.runtime.sim.virtual_time import VirtualTimeLoop, run_virtual


def test_sleep_jumps_without_waiting() -> None:
    async def main() -> float:
        await asyncio.sleep(3600)
        await asyncio.sleep(0.5)
        return asyncio.get_running_loop().time()

    t0 = time.perf_counter()
    assert run_virtual(main()) == pytest.approx(3600.5)
    assert time.perf_counter() - t0 < 1.0


def test_timers_fire_in_virtual_order() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []

        async def at(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            seen.append((name, loop.time()))

        await asyncio.gather(at("c", 30), at("a", 10), at("b", 20))
        return seen

    assert run_virtual(main()) == [("a", 10.0), ("b", 20.0), ("c", 30.0)]


def test_wait_for_times_out_on_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), timeout=5)
        return loop.time()

    assert run_virtual(main()) == pytest.approx(5.0)


def test_thread_result_arrives_before_virtual_timeout() -> None:
    """A thread that takes longer (real) than the virtual timeout still wins; the clock stands still."""

    async def main() -> tuple[str, float, list[float]]:
        loop = asyncio.get_running_loop()
        ticks: list[float] = []

        async def ticker() -> None:
            await asyncio.sleep(0.001)
            ticks.append(loop.time())

        def blocking() -> str:
            time.sleep(0.2)
            return "answer"

        task = asyncio.create_task(ticker())
        answer = await asyncio.wait_for(asyncio.to_thread(blocking), timeout=0.01)
        at = loop.time()
        await task
        return answer, at, ticks

    answer, at, ticks = run_virtual(main(), thread_grace_s=5.0)
    assert answer == "answer"
    assert at == 0.0  # the policy-like call cost no virtual time
    assert ticks == [pytest.approx(0.001)]  # the virtual timer fired only after the thread


def test_hung_thread_lets_virtual_timeout_fire() -> None:
    release = threading.Event()

    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(release.wait, 10), timeout=7)
        release.set()
        return loop.time()

    t0 = time.perf_counter()
    assert run_virtual(main(), thread_grace_s=0.2) == pytest.approx(7.0)
    assert time.perf_counter() - t0 < 5.0


def test_deadlock_is_reported() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(RuntimeStateError, match="deadlocked"):
        run_virtual(main(), idle_timeout_s=0.1)


def test_loop_is_a_selector_event_loop() -> None:
    loop = VirtualTimeLoop()
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
        assert loop.time() == 0.0
    finally:
        loop.close()
