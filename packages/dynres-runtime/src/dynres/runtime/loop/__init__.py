"""The one fully-async driver, written once against :mod:`dynres.runtime.protocols`.

Both apps run it: ``dynres simulate`` (``sim/``, simulated engines on a virtual-time loop) and
``dynres run`` (``realrun/``, real or fake engines). It imports only the protocols, the samples
and ``dynres.core``; never an engine or an app.
"""
