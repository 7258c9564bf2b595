"""Registering every installed dynres policy in verl's policy registry as ``dynres:<name>``."""

from __future__ import annotations

import logging

logger = logging.getLogger("dynres.verl")


def register_dynres_policies() -> list[str]:
    """Put an adapter for each installed dynres policy into verl's registry; return the names added.

    A policy that fails to import or validate (or whose name two distributions claim) is logged
    and skipped; nothing here raises, so ``import verl`` never fails because of dynres.
    """
    added: list[str] = []
    try:
        _register(added)
    except Exception as exc:  # whatever breaks, verl must still import
        logger.warning("dynres-verl: registering dynres policies in verl stopped: %s: %s", type(exc).__name__, exc)
    return added


def _register(added: list[str]) -> None:
    try:
        from dynres.core.loading import installed_policies
        from dynres.verl._verl import registry
        from dynres.verl.adapter import PREFIX, adapter_class
    except Exception as exc:  # verl or dynres broken in this environment: leave verl alone
        logger.warning("dynres-verl: no dynres policies registered in verl: %s: %s", type(exc).__name__, exc)
        return
    reg = registry()
    for name, entries in installed_policies().items():
        if len(entries) > 1:
            who = " and ".join(repr(e.distribution) for e in entries)
            logger.warning("dynres-verl: dynres policy %r is registered by %s; skipped", name, who)
            continue
        try:
            entries[0].load()  # import and validate now, so a broken policy is skipped here
        except Exception as exc:
            logger.warning("dynres-verl: dynres policy %r skipped: %s", name, exc)
            continue
        reg[PREFIX + name] = adapter_class(name)
        added.append(PREFIX + name)
