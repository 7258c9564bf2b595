"""dynres-verl: dynres policies inside verl's fully-async trainer, verl's policies inside dynres.

Nothing here imports verl at import time: :mod:`dynres.verl.plugin` (verl's ``verl.plugins``
entry point) registers ``dynres:<name>`` adapters (:mod:`dynres.verl.adapter`), and
:mod:`dynres.verl.hooks` (a ``dynres.plugins`` entry point) resolves ``verl:<name>`` to a wrapper
(:mod:`dynres.verl.wrapper`). :mod:`dynres.verl.router` is a rollout load balancer verl can be
pointed at (``rollout.router_config_path``) that routes by a dynres policy's request decisions.
"""

__version__ = "0.1.0"
