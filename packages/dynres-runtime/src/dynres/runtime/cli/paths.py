"""Output paths of the CLI, checked before a command starts any work."""

from __future__ import annotations

import os
from pathlib import Path

from dynres.core.errors import ConfigError


def check_output_dir(path: Path, option: str, *, create: bool = True) -> None:
    """Raise ConfigError naming ``option`` unless ``path`` is (or can become) a writable directory.

    With ``create`` the directory is made now; without, only its nearest existing ancestor is checked.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path}: exists and is not a directory; choose another path")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{option} {path}: cannot create the directory ({exc.strerror}); choose another path"
            ) from None
        return
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: {parent} is a file, so the directory cannot be made; choose another path")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{option} {path}: {parent} is not writable; choose another path")


def check_output_file(path: Path, option: str) -> None:
    """Raise ConfigError naming ``option`` unless ``path`` can be written as a file (its directory exists)."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: the directory {parent} does not exist; create it or choose another path")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{option} {path}: the directory {parent} is not writable; choose another path")
