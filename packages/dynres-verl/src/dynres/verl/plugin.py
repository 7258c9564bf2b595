"""The ``verl.plugins`` entry point: ``import verl`` imports this module, which registers dynres policies.

verl loads every entry point of its ``verl.plugins`` group at the end of ``import verl`` (unless
``VERL_USE_EXTERNAL_PLUGINS=none``); loading this module adds ``dynres:<name>`` for each
installed dynres policy to verl's dynamic-schedule registry. It never raises.
"""

from __future__ import annotations

from dynres.verl.registration import register_dynres_policies

REGISTERED: list[str] = register_dynres_policies()
"""The ``dynres:<name>`` entries this import added to verl's registry."""
