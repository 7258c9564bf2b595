"""dynres testkit: fakes, strategies, scenarios, the policy conformance suite and its pytest plugin.

Nothing is imported here on purpose: the pytest plugin is loaded into every pytest session of an
environment where the testkit is installed, so each submodule is imported only when used
(``dynres.testkit.checks``, ``.strategies``, ``.scenarios``, ``.fakes``, ``.broken_policies``).
"""
