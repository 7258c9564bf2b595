"""dynres testkit: fakes, strategies, the policy conformance suite and its pytest plugin."""
