"""Engines behind the runtime's protocols: fakes, vLLM, torch, Megatron and their Ray actors.

Each module implements :mod:`dynres.runtime.protocols`; none imports the fully-async loop or
either app (``sim``, ``realrun``), so an engine can be tested and reused on its own.
"""
