"""The garbage-collector settings of a run: start-up freeze and no full collection mid-transition.

CPython's cyclic collector stops the whole interpreter while it runs. A full (oldest-generation)
collection scans every tracked object: the modules, models and clients built at start-up, and
more than a dozen objects per request in flight (task, coroutine, request, result, futures). At
100,000 requests in flight that is a pause of hundreds of milliseconds on the coordinator's one
event loop, far above the 10 ms lag target of a deactivation (docs/scaling.md). Two steps keep
those pauses away:

1. **Start-up** (:func:`run_gc_control`, entered by ``FullyAsyncRun.run``, so by ``dynres run``,
   ``dynres simulate`` and any program that runs the loop): one collection, then ``gc.freeze()``
   moves every object that exists before the first cycle (modules, models, clients, replicas)
   into the permanent generation, which no collection scans again. It is undone when the run
   ends (the last run, when several share the process), so frozen objects that die afterwards
   are collected as usual, unless the host program had frozen objects itself before the run:
   CPython can only unfreeze everything at once (``gc.unfreeze()``), which would undo the
   host's own freeze, so the runtime then leaves its objects frozen too (they are start-up
   objects that live as long as the host's; the host's next ``gc.unfreeze()`` releases both).
   The same holds for a freeze the host makes during the run: the runtime notices it as more
   frozen objects at the end than right after its own freeze (frozen objects only leave by
   dying), and leaves everything frozen.
2. **Transitions** (:func:`no_full_collection`, held by the controller while it activates,
   deactivates or rebalances, and by the balancer while aborted requests wait to be retried):
   full collections are deferred, a young collection runs every ``_YOUNG`` (300) net
   allocations instead of 700, and the middle generation is collected every second young
   collection instead of every eleventh (CPython collects a generation once its count
   *exceeds* its threshold, so ``_MIDDLE_EVERY = 1`` means every second). A middle collection
   scans everything allocated since the last one, and with millions of long-lived objects
   around each scanned object costs a cache miss or two: eleven young collections' worth
   (thousands of objects) is a pause of milliseconds on a busy core. During a transition nearly
   everything allocated survives (it is the state of requests in flight), and smaller, more
   frequent collections cut the pause without costing more in total (docs/scaling.md, "The
   runtime's garbage-collector step", has the measured pauses and the command). The collector's
   own thresholds come back, and it catches up, after.

Objects freed by reference counting (nearly all of them) are freed at once either way; only
garbage in reference cycles waits for a collection.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_NEVER = 1 << 30
_YOUNG = 300
_MIDDLE_EVERY = 1
_state = {"runs": 0, "deferrals": 0, "host_frozen": 0, "run_frozen": 0}
_saved: dict[str, int] = {}


@contextlib.contextmanager
def run_gc_control() -> Iterator[None]:
    """Collect once and freeze the start-up objects for the run's duration (nested runs share it)."""
    if _state["runs"] == 0:
        # Objects the host froze itself stay frozen after the run (see the module doc).
        _state["host_frozen"] = gc.get_freeze_count()
        gc.collect()
        gc.freeze()
        _state["run_frozen"] = gc.get_freeze_count()
    _state["runs"] += 1
    try:
        yield
    finally:
        _state["runs"] -= 1
        if _state["runs"] == 0:
            if not _state["host_frozen"] and gc.get_freeze_count() <= _state["run_frozen"]:
                gc.unfreeze()
            if _state["deferrals"]:
                # A balancer whose loop closed mid-burst never ends its stretch; the process
                # must not keep full collections off after the last run.
                _state["deferrals"] = 1
                resume_full_collections()


def defer_full_collections() -> None:
    """Start a stretch without full collections (pair with :func:`resume_full_collections`)."""
    if _state["deferrals"] == 0:
        t0, t1, t2 = gc.get_threshold()
        _saved["defer"] = t2
        _saved["middle"] = t1
        _saved["young"] = t0
        gc.set_threshold(min(t0, _YOUNG), min(t1, _MIDDLE_EVERY), _NEVER)
    _state["deferrals"] += 1


def resume_full_collections() -> None:
    """End one stretch started by :func:`defer_full_collections`; the last one restores the threshold."""
    if _state["deferrals"] <= 0:
        return
    _state["deferrals"] -= 1
    if _state["deferrals"] == 0:
        gc.set_threshold(_saved.pop("young"), _saved.pop("middle"), _saved.pop("defer"))


class no_full_collection:
    """No full collection inside the block (young and middle generations are still collected).

    Works with ``with`` and ``async with`` (so it joins an ``async with lock, ...`` line).
    """

    def __enter__(self) -> None:
        defer_full_collections()

    def __exit__(self, *exc: object) -> None:
        resume_full_collections()

    async def __aenter__(self) -> None:
        defer_full_collections()

    async def __aexit__(self, *exc: object) -> None:
        resume_full_collections()


def full_collections_deferred() -> bool:
    """True while some part of the runtime defers full collections."""
    return _state["deferrals"] > 0
