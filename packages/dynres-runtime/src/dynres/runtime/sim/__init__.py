"""The simulator: the real runtime on a virtual-time event loop with a modelled workload.

* :mod:`.loop`      the virtual-time asyncio loop (``run_virtual``)
* :mod:`.workload`  response lengths, replica and trainer speed (every formula)
* :mod:`.scenario`  scenario files (pydantic, ``extra="forbid"``) and ``load_scenario``
* :mod:`.presets`   the shipped presets (YAML package data)
* :mod:`.bound`     the analytic lower bound on end-to-end time
"""
