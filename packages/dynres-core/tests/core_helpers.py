"""Helpers shared by the dynres-core tests (a uniquely named module, importable from test files)."""

from __future__ import annotations

from dynres.core import ScheduleContext


def make_ctx(**overrides: object) -> ScheduleContext:
    """A valid context (8 samples per collection, 4 collections per cycle, 2+2 replicas)."""
    fields: dict[str, object] = dict(
        required_samples=8,
        trigger_parameter_sync_step=4,
        num_standalone_replicas=2,
        num_hybrid_replicas=2,
    )
    fields.update(overrides)
    return ScheduleContext(**fields)
