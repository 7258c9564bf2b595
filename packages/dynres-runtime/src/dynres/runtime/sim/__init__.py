"""The simulator: the real runtime on a virtual-time event loop with a modelled workload.

* :mod:`.virtual_time`  the virtual-time asyncio loop (``run_virtual``)
* :mod:`.workload`  response lengths, replica and trainer speed (every formula)
* :mod:`.scenario`  scenario files (pydantic, ``extra="forbid"``) and ``load_scenario``
* :mod:`.presets`   the shipped presets (YAML package data)
* :mod:`.bound`     the analytic lower bound on end-to-end time
* :mod:`.runner`    ``simulate()``: one run, on the dynres runtime or under verl's controller (:mod:`.verl_host`)
* :mod:`.plan`, :mod:`.comparison`  the runs of one ``dynres simulate``, validated, then compared
* :mod:`.fit`       ``dynres scenario fit/compare``: a scenario fitted to a run's metrics
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynres.runtime.sim.runner import SimResult, simulate

__all__ = ["SimResult", "simulate"]


def __getattr__(name: str) -> Any:
    # Lazy: importing dynres.runtime.sim (e.g. for presets) must not import the whole runtime.
    if name in __all__:
        from dynres.runtime.sim import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
