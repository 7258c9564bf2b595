"""The fake train engine: fit steps that sleep for configured phase times, lifecycle rules checked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dynres.core.errors import BackendError
from dynres.runtime.backends.fake.faults import TRAIN_OPS, FaultsMixin, FaultSpec, OpRecord, fault_map, latency_map
from dynres.runtime.protocols import OperationCosts, TrainStepResult, WeightUpdate

FAKE_STATE_FILE = "state.json"
"""File the fake train engine's ``save_state`` writes (its counters)."""


class FakeTrainEngine(FaultsMixin):
    """An in-process train engine: fit steps take the configured phase times."""

    def __init__(
        self,
        *,
        phase_times: Mapping[str, float] | None = None,
        per_sample_s: float = 0.0,
        latency: float | Mapping[str, float] = 0.0,
        fail_on: Mapping[str, FaultSpec] | None = None,
        hang_on: Iterable[str] = (),
        log: list[OpRecord] | None = None,
        weights_nbytes: int = 0,
    ) -> None:
        """Build a train engine.

        :param phase_times: seconds per phase of one fit step (default ``update_actor``: 1.0);
            a fit step sleeps for their sum.
        :param per_sample_s: extra ``update_actor`` seconds per sample in the batch.
        :param latency: seconds for ``offload``, ``onload``, ``export_weights`` (one number or
            a mapping); ``train_step`` uses ``phase_times`` instead.
        :param fail_on: op -> exception (instance, class or builtin name) raised at the start of that op.
        :param hang_on: ops that never return (until cancelled).
        :param log: op log to append to.
        :param weights_nbytes: size reported by exported weight updates (bytes).
        """
        self.target = "trainer"
        self.phase_times = dict(phase_times if phase_times is not None else {"update_actor": 1.0})
        """Seconds per phase of one fit step."""
        self.per_sample_s = per_sample_s
        """Extra update_actor seconds per sample (seconds/sample)."""
        self.latency = latency_map(latency, TRAIN_OPS)
        """Seconds per operation."""
        self.latency["train_step"] = 0.0
        fail, hang = fault_map(fail_on, hang_on, TRAIN_OPS)
        self.fail_on = fail
        """op -> exception raised at the start of that op."""
        self.hang_on = hang
        """Ops that never return."""
        self.log: list[OpRecord] = log if log is not None else []
        """Every call's start and end, in order (shared between fakes to order calls across them)."""
        self.violations: list[str] = []
        """Lifecycle rules broken by the caller (must stay empty)."""
        self.offloaded = False
        """Parameters and optimizer state are off the GPU."""
        self.steps = 0
        """Fit steps run (count)."""
        self.exports = 0
        """Weight exports (count)."""
        self.batches: list[list[Any]] = []
        """Every batch trained on, in order."""
        self.weights_nbytes = weights_nbytes

    async def train_step(self, batch: Sequence[Any]) -> TrainStepResult:
        """Sleep for the phase times and report them."""
        await self._enter("train_step", f"{len(batch)} samples")
        if self.offloaded:
            self.violations.append(f"train_step {self.steps + 1} while offloaded")
        phases = dict(self.phase_times)
        if self.per_sample_s:
            phases["update_actor"] = phases.get("update_actor", 0.0) + self.per_sample_s * len(batch)
        total = sum(phases.values())
        if total > 0:
            await asyncio.sleep(total)
        self.steps += 1
        self.batches.append(list(batch))
        self._record("train_step", "end", f"step={self.steps}")
        return TrainStepResult(phase_times=phases, metrics={"samples": float(len(batch))})

    async def offload(self) -> None:
        """Free the GPU for hybrid replicas."""
        await self._enter("offload")
        self.offloaded = True
        self._record("offload", "end")

    async def onload(self) -> None:
        """Take the GPU back."""
        await self._enter("onload")
        self.offloaded = False
        self._record("onload", "end")

    async def export_weights(self) -> WeightUpdate:
        """Export the current weights (version = exports so far + 1)."""
        await self._enter("export_weights")
        self.exports += 1
        self._record("export_weights", "end", f"version={self.exports}")
        return WeightUpdate(version=self.exports, nbytes=self.weights_nbytes)

    async def save_state(self, path: str) -> None:
        """Write the step and export counters (the fake's weights and optimizer) to ``path/state.json``."""
        await self._enter("save_state", path)
        state = {"steps": self.steps, "exports": self.exports}
        (Path(path) / FAKE_STATE_FILE).write_text(json.dumps(state), encoding="utf-8")
        self._record("save_state", "end", f"step={self.steps}")

    async def load_state(self, path: str) -> None:
        """Load the counters :meth:`save_state` wrote; BackendError when ``path`` has none."""
        await self._enter("load_state", path)
        try:
            state = json.loads((Path(path) / FAKE_STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BackendError(f"FakeTrainEngine: no state to load in {path} ({exc})") from exc
        self.steps, self.exports = int(state["steps"]), int(state["exports"])
        self._record("load_state", "end", f"step={self.steps}")

    def costs(self) -> OperationCosts:
        """The configured latencies as cost estimates (seconds)."""
        lat = self.latency
        return OperationCosts(offload_s=lat["offload"], onload_s=lat["onload"], export_weights_s=lat["export_weights"])

    async def shutdown(self) -> None:
        """Nothing to release."""
        await self._enter("shutdown")
        self._record("shutdown", "end")
