"""pytest plugin of the dynres testkit (registered through the ``pytest11`` entry point)."""
