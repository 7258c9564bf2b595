"""Built-in dynres policies (registered in the ``dynres.policies`` entry-point group)."""
