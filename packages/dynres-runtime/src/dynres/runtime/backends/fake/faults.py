"""What the fakes share: injected latency, failures and hangs per operation, the op log, violations.

Every operation of a fake logs its start and its end (or error) as an :class:`OpRecord` with the
loop's time, into a list that several fakes may share, so a test can assert the order of events
across replicas and the trainer. Faults are checked when a fake is built: an unknown operation
or something that is not an exception is a :class:`~dynres.core.errors.ConfigError` there, not
a surprise in the middle of a run.
"""

from __future__ import annotations

import asyncio
import builtins
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from dynres.core.errors import BackendError, ConfigError

REPLICA_OPS: tuple[str, ...] = (
    "generate",
    "abort",
    "pause",
    "resume",
    "sleep",
    "wake_up",
    "update_weights",
    "health",
    "shutdown",
)
"""Operations of a fake replica that accept a latency, a failure or a hang."""

TRAIN_OPS: tuple[str, ...] = (
    "train_step",
    "offload",
    "onload",
    "export_weights",
    "save_state",
    "load_state",
    "shutdown",
)
"""Operations of a fake train engine that accept a latency, a failure or a hang."""


@dataclass(frozen=True)
class OpRecord:
    """One entry of an op log."""

    t: float
    """Event-loop time of the event (seconds)."""
    target: str
    """Replica id, or ``"trainer"``."""
    op: str
    """Operation name (``generate``, ``abort``, ``sleep``, ...)."""
    event: Literal["start", "end", "error"]
    """Start of the call, its normal end, or its end by an exception."""
    detail: str = ""
    """Free text: request id, tags, version, error."""


def latency_map(latency: float | Mapping[str, float], ops: Sequence[str]) -> dict[str, float]:
    """Seconds per operation of ``ops`` from one number or a partial mapping (missing ops: 0)."""
    if isinstance(latency, Mapping):
        unknown = set(latency) - set(ops)
        if unknown:
            raise ConfigError(f"unknown op(s) {sorted(unknown)} in latency; valid: {list(ops)}")
        out = {op: float(latency.get(op, 0.0)) for op in ops}
    else:
        out = {op: float(latency) for op in ops}
    bad = {op: v for op, v in out.items() if not (0.0 <= v < math.inf)}
    if bad:
        raise ConfigError(f"latency must be finite seconds >= 0; got {bad}")
    return out


FaultSpec = BaseException | type[BaseException] | str
"""An injected failure: an exception instance or class, or (as a YAML file gives it) the name of a
builtin exception or ``BackendError``."""


def fault_map(
    fail_on: Mapping[str, FaultSpec] | None, hang_on: Iterable[str], ops: Sequence[str]
) -> tuple[dict[str, BaseException | type[BaseException]], set[str]]:
    """Check injected faults: known ops, and each failure an exception class or instance (names resolved)."""
    given = dict(fail_on or {})
    hang = set(hang_on)
    unknown = (set(given) | hang) - set(ops)
    if unknown:
        raise ConfigError(f"unknown op(s) {sorted(unknown)} in fail_on/hang_on; valid: {list(ops)}")
    fail: dict[str, BaseException | type[BaseException]] = {}
    for op, err in given.items():
        if isinstance(err, str):  # from a YAML file: the name of a builtin exception or BackendError
            named = BackendError if err == "BackendError" else getattr(builtins, err, None)
            if not (isinstance(named, type) and issubclass(named, BaseException)):
                raise ConfigError(
                    f"fail_on[{op!r}] names no exception {err!r}; use a builtin one (e.g. RuntimeError) or BackendError"
                )
            err = named
        ok = isinstance(err, BaseException) or (isinstance(err, type) and issubclass(err, BaseException))
        if not ok:
            raise ConfigError(f"fail_on[{op!r}] is {err!r}; give an exception class or instance (e.g. RuntimeError)")
        fail[op] = err
    return fail, hang


class FaultsMixin:
    """Latency, failure and hang injection shared by both fakes."""

    target: str
    latency: dict[str, float]
    fail_on: dict[str, BaseException | type[BaseException]]
    hang_on: set[str]
    log: list[OpRecord]
    violations: list[str]

    def _record(
        self,
        op: str,
        event: Literal["start", "end", "error"],
        detail: str = "",
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # ``loop``: for events driven from outside a running loop (a test's advance()/finish()).
        t = (loop or asyncio.get_running_loop()).time()
        self.log.append(OpRecord(t, self.target, op, event, detail))

    async def _enter(self, op: str, detail: str = "") -> None:
        """Log the start, then apply the injected hang, failure and latency of ``op``."""
        self._record(op, "start", detail)
        await self._inject(op)
        delay = self.latency.get(op, 0.0)
        if delay > 0:
            await asyncio.sleep(delay)

    async def _inject(self, op: str) -> None:
        """Apply the injected hang, then the injected failure, of ``op``."""
        if op in self.hang_on:
            try:
                await asyncio.Event().wait()  # forever; a caller's timeout cancels it
            except asyncio.CancelledError:
                self._record(op, "error", "cancelled while hanging")
                raise
        err = self.fail_on.get(op)
        if err is not None:
            exc = err(f"injected failure of {op} on {self.target}") if isinstance(err, type) else err
            self._record(op, "error", repr(exc))
            raise exc

    def ops(self, op: str | None = None, event: str | None = "start") -> list[OpRecord]:
        """This fake's log entries, filtered by operation and event (None = any)."""
        return [
            r
            for r in self.log
            if r.target == self.target and (op is None or r.op == op) and (event is None or r.event == event)
        ]
