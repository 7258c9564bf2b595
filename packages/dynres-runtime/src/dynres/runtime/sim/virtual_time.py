"""A virtual-time asyncio event loop: the runtime's own code, run without waiting for real time.

The loop is an ordinary :class:`asyncio.SelectorEventLoop` with two changes:

* :meth:`VirtualTimeLoop.time` returns a virtual clock (seconds, starting at 0) instead of the
  monotonic clock, so ``asyncio.sleep``, ``asyncio.wait_for``, ``asyncio.timeout`` and
  ``loop.call_later`` all run on virtual time;
* its selector never sleeps for a timer: when nothing is ready, the clock jumps straight to the
  next timer.

One exception keeps results right: while work submitted with ``run_in_executor`` (and so
``asyncio.to_thread``, which the controller uses for policy calls under a timeout) is still
running in a thread, the selector blocks *for real* on the loop's self-pipe and the virtual clock
stands still. A thread's answer therefore always arrives before any virtual timeout fires, however
slow the host is, and a policy call costs zero virtual time (which keeps runs deterministic). A
thread that has held the clock for ``thread_grace_s`` real seconds is treated as hung: virtual time
moves on again, so the caller's virtual timeout can fire and the runtime's fallback takes over.

Real time (``time.monotonic``) is read here, and only here, to measure that grace period; it
never reaches the virtual clock.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple, Unpack

from dynres.core.errors import RuntimeStateError

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

DEFAULT_THREAD_GRACE_S = 5.0
"""Real seconds a pending thread may hold the virtual clock before it counts as hung."""

DEFAULT_IDLE_TIMEOUT_S = 30.0
"""Real seconds the loop waits with no timer and no thread before declaring a deadlock."""


class VirtualClock:
    """The virtual clock plus the set of pending thread jobs that freeze it (seconds)."""

    def __init__(self, start: float = 0.0) -> None:
        """Start the clock at ``start`` virtual seconds."""
        self.now: float = float(start)
        """Current virtual time (seconds)."""
        self.jumps: int = 0
        """How many times the clock jumped to a timer (count; a speed diagnostic)."""
        self._holds: dict[int, float] = {}

    def hold(self, key: int) -> None:
        """Freeze the clock for job ``key`` until :meth:`release` (records the real start time)."""
        self._holds[key] = time.monotonic()

    def release(self, key: int) -> None:
        """Let job ``key`` stop freezing the clock (no-op when unknown)."""
        self._holds.pop(key, None)

    @property
    def pending_threads(self) -> int:
        """Thread jobs currently holding the clock, hung ones included (count)."""
        return len(self._holds)

    def real_wait_left(self, grace_s: float) -> float:
        """Real seconds until the youngest live hold runs out of grace (0 when none is live)."""
        if not self._holds:
            return 0.0
        newest = max(self._holds.values())
        return max(0.0, grace_s - (time.monotonic() - newest))


class VirtualTimeSelector(selectors.BaseSelector):
    """Wraps a real selector; ``select(timeout)`` advances the virtual clock instead of sleeping."""

    def __init__(
        self,
        clock: VirtualClock,
        *,
        thread_grace_s: float = DEFAULT_THREAD_GRACE_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        """Wrap a fresh default selector and drive ``clock``; grace/idle limits are real seconds."""
        self._real = selectors.DefaultSelector()
        self._clock = clock
        self._grace = thread_grace_s
        self._idle = idle_timeout_s

    # Registration is delegated unchanged: the loop's self-pipe (how threads wake the loop) and
    # any real file descriptor keep working.
    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        """Register ``fileobj`` with the real selector."""
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        """Unregister ``fileobj`` from the real selector."""
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        """Change the events watched for ``fileobj``."""
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        """The real selector's key map."""
        return self._real.get_map()

    def close(self) -> None:
        """Close the real selector."""
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """Return ready I/O; when none and a timer is due in ``timeout`` virtual s, jump to it."""
        clock = self._clock
        if timeout is not None and timeout <= 0:
            return self._real.select(0)
        # A live thread job freezes virtual time: block for real until it (or anything) wakes
        # the loop through the self-pipe, up to the job's remaining grace.
        while True:
            wait = clock.real_wait_left(self._grace)
            if wait <= 0:
                break
            events = self._real.select(wait)
            if events:
                return events
        events = self._real.select(0)
        if events:
            return events
        if timeout is None:
            if clock.pending_threads:
                # Only hung threads remain: nothing virtual can happen until one finishes.
                return self._real.select(None)
            events = self._real.select(self._idle)
            if not events:
                raise RuntimeStateError(
                    "the virtual-time loop has no timer, no pending thread and no I/O for "
                    f"{self._idle:g} real seconds: the simulated run is deadlocked (some task "
                    "awaits an event nothing will set); check the runtime's wait conditions"
                )
            return events
        clock.now += timeout
        clock.jumps += 1
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and which never sleeps for a timer."""

    def __init__(
        self,
        *,
        start: float = 0.0,
        thread_grace_s: float = DEFAULT_THREAD_GRACE_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        """Start virtual time at ``start`` s; ``thread_grace_s``/``idle_timeout_s`` are real seconds."""
        self.clock = VirtualClock(start)
        super().__init__(VirtualTimeSelector(self.clock, thread_grace_s=thread_grace_s, idle_timeout_s=idle_timeout_s))

    def time(self) -> float:
        """Virtual time in seconds."""
        return self.clock.now

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[Ts]], T], *args: *Ts
    ) -> asyncio.Future[T]:
        """Run ``func`` in a thread like the base loop, freezing virtual time until it finishes."""
        fut = super().run_in_executor(executor, func, *args)
        key = id(fut)
        self.clock.hold(key)
        fut.add_done_callback(lambda _f: self.clock.release(key))
        return fut

    async def shutdown_default_executor(self) -> None:
        """Shut the default executor down; its helper thread holds the clock while it joins."""
        key = id(self) ^ 0x5EED
        self.clock.hold(key)
        try:
            await super().shutdown_default_executor()
        finally:
            self.clock.release(key)


def run_virtual(
    main: Coroutine[Any, Any, T] | Callable[[], Coroutine[Any, Any, T]],
    *,
    thread_grace_s: float = DEFAULT_THREAD_GRACE_S,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> T:
    """Run a coroutine to completion on a fresh virtual-time loop and return its result.

    ``main`` may be a coroutine or a zero-argument async callable. Virtual time starts at 0.
    """
    coro = main() if callable(main) else main
    with asyncio.Runner(
        loop_factory=lambda: VirtualTimeLoop(thread_grace_s=thread_grace_s, idle_timeout_s=idle_timeout_s)
    ) as runner:
        return runner.run(coro)
