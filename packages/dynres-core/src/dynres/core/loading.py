"""Finding and building policies: the ``dynres.policies`` entry-point group and import paths."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from dynres.core.errors import (
    DuplicatePolicyError,
    DynresError,
    PolicyError,
    PolicyImportError,
    PolicyNotFoundError,
    PolicyValidationError,
    did_you_mean,
)
from dynres.core.policy import Policy, validate_policy_class

POLICIES_GROUP = "dynres.policies"
"""Entry-point group in which distributions register policies (``name = "module:Class"``)."""


@dataclass(frozen=True)
class PolicyEntry:
    """One installed policy as registered by a distribution (not yet imported)."""

    name: str
    """Registry name (the entry point's name)."""
    value: str
    """Import path ``module:Class``."""
    distribution: str
    """Name of the distribution that registers it."""
    version: str
    """Version of that distribution."""

    def load(self) -> type[Policy]:
        """Import and validate the policy class; raise PolicyImportError naming the distribution."""
        where = f"entry point {self.name!r} = {self.value!r} of distribution {self.distribution!r}"
        try:
            obj = EntryPoint(name=self.name, value=self.value, group=POLICIES_GROUP).load()
        except Exception as exc:  # third-party import-time failures of any kind
            raise PolicyImportError(
                f"policy {self.name!r} failed to import from distribution {self.distribution!r} "
                f"({self.value}): {type(exc).__name__}: {exc}; fix or reinstall "
                f"{self.distribution!r}"
            ) from exc
        cls = validate_policy_class(obj, where=where)
        if cls.name != self.name:
            raise PolicyValidationError(
                f"{where} points to a class whose name is {cls.name!r}; make the entry-point "
                "name and the class's name attribute equal"
            )
        return cls


@functools.cache
def installed_policies() -> dict[str, tuple[PolicyEntry, ...]]:
    """Return every policy registered in ``dynres.policies``, by name (cached; see clear_policy_cache).

    A name maps to more than one entry when two distributions claim it.
    """
    found: dict[str, dict[tuple[str, str], PolicyEntry]] = {}
    for ep in entry_points(group=POLICIES_GROUP):
        dist = ep.dist.name if ep.dist is not None else "<unknown distribution>"
        version = ep.dist.version if ep.dist is not None else "?"
        # One distribution can appear twice on sys.path (editable + copy); count it once.
        found.setdefault(ep.name, {})[(dist, ep.value)] = PolicyEntry(ep.name, ep.value, dist, version)
    return {name: tuple(entries.values()) for name, entries in sorted(found.items())}


def clear_policy_cache() -> None:
    """Forget the cached entry-point scan (after installing a distribution in the same process)."""
    installed_policies.cache_clear()
    # The import system and importlib.metadata cache directory listings too; without this a
    # distribution written into an already-scanned directory may stay invisible.
    importlib.invalidate_caches()


def _classes_in(path: str) -> str:
    """The classes a Python file defines at its top level, read without running it ('' if none or unreadable)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    return "|".join(node.name for node in tree.body if isinstance(node, ast.ClassDef))


def policy_entry(name: str) -> PolicyEntry:
    """Return the single installed entry for ``name``; raise on unknown or duplicate names."""
    registry = installed_policies()
    entries = registry.get(name)
    if not entries:
        names = ", ".join(registry) or "(none)"
        if name.endswith(".py"):
            # A file named without its class: say how to name one, not how to install a package.
            raise PolicyNotFoundError(
                f"policy {name!r} names a file but no class; name the class too, as "
                f"{name}:{_classes_in(name) or 'ClassName'} (a Policy subclass defined in the file)"
            )
        base, bracket, rest = name.partition("[")
        if bracket and base in registry and rest.endswith("]"):
            # NAME[KEY=VALUE] is how benchmarks/policy_bench.py names a configuration; a run
            # config or the CLI takes the params apart from the name.
            first = rest[:-1].split(";")[0].strip() or "KEY=VALUE"
            raise PolicyNotFoundError(
                f"policy {name!r} carries params in its name; name it {base!r} and set the params "
                f"under async_training.dynamic_schedule_policy_params (dynres simulate and dynres run: "
                f"--set async_training.dynamic_schedule_policy_params.{first})"
            )
        raise PolicyNotFoundError(
            f"unknown policy {name!r}{did_you_mean(name, registry)}; installed policies: {names}. "
            f"Install a distribution that registers it in the {POLICIES_GROUP!r} entry-point "
            "group, or name it as 'module:Class'"
        )
    if len(entries) > 1:
        who = " and ".join(f"{e.distribution!r} ({e.value})" for e in entries)
        raise DuplicatePolicyError(
            f"policy name {name!r} is registered by {who}; uninstall one of them or load the "
            "one you want as 'module:Class'"
        )
    return entries[0]


def import_object(
    path: str,
    *,
    what: str = "object",
    error: type[DynresError] = PolicyImportError,
    hint: str = "check the path and that its distribution is installed",
) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute; raise ``error`` naming the part that failed.

    ``what`` names the thing in messages (e.g. ``"policy"``, ``"reward_fn"``); ``hint`` is the fix
    suggested when the module does not import.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{what} {path!r} is not an import path; write it as 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # third-party import-time failures of any kind
        raise error(
            f"{what} {path!r}: module {module_name!r} failed to import: {type(exc).__name__}: {exc}; {hint}"
        ) from exc
    obj, missing = _attribute(module, attr)
    if missing is not None:
        raise error(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}{missing}")
    return obj


def _attribute(module: Any, dotted: str) -> tuple[Any, str | None]:
    """``(module.<dotted>, None)``, or ``(None, did-you-mean hint)`` when a part of the name is missing."""
    obj: Any = module
    try:
        for part in dotted.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None, did_you_mean(dotted, dir(module))
    return obj, None


def import_from_file(spec: str, *, what: str = "policy") -> Any:
    """Import ``"path/to/file.py:Name"`` (the file run once per process) and return ``Name``.

    Raises PolicyImportError naming the file and the fix when it is missing, fails to import or
    lacks ``Name``.
    """
    head, _, attr = spec.rpartition(":")
    path = Path(head)
    if not attr:
        raise PolicyImportError(f"{what} {spec!r}: name the class after the file, e.g. {head}:MyPolicy")
    if not path.is_file():
        raise PolicyImportError(f"{what} {spec!r}: file {head!r} not found; check the path (relative to the cwd)")
    # One module per resolved file, so naming the same file twice imports it once.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    mod_name = f"_dynres_file_{digest}"
    module = sys.modules.get(mod_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise PolicyImportError(f"{what} {spec!r}: cannot import {head!r} as a module; give a .py file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:  # user code may fail at import time in any way
            del sys.modules[mod_name]
            raise PolicyImportError(
                f"{what} {spec!r}: {head!r} failed to import: {type(exc).__name__}: {exc}; fix the file"
            ) from exc
    obj, missing = _attribute(module, attr)
    if missing is not None:
        raise PolicyImportError(f"{what} {spec!r}: {head!r} defines no {attr!r}{missing}")
    return obj


def resolve_policy_class(spec: str | type[Policy]) -> type[Policy]:
    """Return the Policy class a policy name stands for, or validate a class.

    Names: a registered name, a name a plugin claims through ``dynres_resolve_policy``
    (``verl:<name>``), ``module:Class`` or ``path/to/file.py:Class``.
    """
    if isinstance(spec, type):
        return validate_policy_class(spec)
    if not isinstance(spec, str) or not spec.strip():
        raise PolicyError(f"a policy is named by a non-empty string or a class, not {spec!r}")
    spec = spec.strip()
    if ":" not in spec:
        return policy_entry(spec).load()
    claimed = resolve_by_plugin(spec)
    if claimed is not None:
        return claimed
    kind = "file path" if _names_a_file(spec) else "import path"
    return validate_policy_class(import_policy_path(spec), where=f"{kind} {spec!r}")


def _names_a_file(spec: str) -> bool:
    return spec.rpartition(":")[0].endswith(".py")


def import_policy_path(spec: str) -> Any:
    """Import what ``module:Class`` or ``path/to/file.py:Class`` names, without validating it as a policy.

    Raises PolicyImportError naming the spec and the fix when the module or file does not import.
    """
    if _names_a_file(spec):
        return import_from_file(spec, what="policy")
    return import_object(spec, what="policy", error=PolicyImportError, hint=_policy_import_hint(spec))


VERL_PREFIX = "verl:"
"""Prefix of verl's own policies (``verl:default``), answered by dynres-verl's plugin."""


def resolve_by_plugin(spec: str) -> type[Policy] | None:
    """Ask the ``dynres_resolve_policy`` hook of the installed plugins about ``spec``; None if none claims it.

    A ``verl:<name>`` that no plugin claims raises PolicyNotFoundError naming ``pip install
    dynres-verl``, instead of being read as the attribute ``<name>`` of a module ``verl``.
    """
    from dynres.core.plugins import autoload_disabled, get_plugin_manager

    obj = get_plugin_manager().hook.dynres_resolve_policy(name=spec)
    if obj is not None:
        return validate_policy_class(obj, where=f"the plugin that resolved {spec!r}")
    if spec.startswith(VERL_PREFIX):
        why = " (plugin autoloading is off: DYNRES_DISABLE_PLUGIN_AUTOLOAD)" if autoload_disabled() else ""
        raise PolicyNotFoundError(
            f"policy {spec!r} names one of verl's own policies, which needs the dynres-verl bridge{why}; "
            "install it with `pip install dynres-verl`"
        )
    return None


def _policy_import_hint(spec: str) -> str:
    """The fix to suggest when ``module:Class`` does not import: sys.path or the file form."""
    module_name, _, cls = spec.partition(":")
    as_file = module_name.replace(".", "/") + ".py"
    return (
        "install the distribution that provides it, or make the module importable: run with "
        f"PYTHONPATH=. when {module_name.split('.')[0]!r} is a folder of the current directory, or name "
        f"the file instead: {as_file}:{cls}"
    )


def load_policy(spec: str | type[Policy], params: Policy.Params | Mapping[str, Any] | None = None) -> Policy:
    """Build a policy from a registered name, ``module:Class``, ``file.py:Class`` or class, with validated params."""
    cls = resolve_policy_class(spec)
    return cls(params)


def policy_from_config(async_training: Any, spec: str | type[Policy] | None = None) -> Policy:
    """Build the policy an ``async_training`` section names (or ``spec``), with params from that section.

    ``spec`` replaces ``dynamic_schedule_policy`` (a name, ``module:Class``, ``file.py:Class`` or
    class); params come from ``dynamic_schedule_policy_params`` and the starting ratio. Raises the
    PolicyError subclasses of :func:`resolve_policy_class` and PolicyParamsError on bad params.
    """
    from dynres.core.config import policy_params_from_config

    cls = resolve_policy_class(spec if spec is not None else async_training.dynamic_schedule_policy)
    params = policy_params_from_config(async_training, cls.Params)
    try:
        return cls(params)
    except DynresError:
        raise
    except Exception as exc:  # third-party constructor: anything may come out
        raise PolicyError(
            f"policy {getattr(cls, 'name', cls.__name__)!r} ({cls.__module__}:{cls.__qualname__}): its constructor "
            f"raised {type(exc).__name__}: {exc}; fix its __init__ or its params"
        ) from exc
