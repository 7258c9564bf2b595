"""Shared setup of the testkit's own tests."""

pytest_plugins = ["pytester"]
