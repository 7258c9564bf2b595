"""The one exception hierarchy of dynres.

Every error raised on purpose by any dynres distribution derives from :class:`DynresError`.
Messages name the offending thing and say how to fix it, so the CLI can print ``str(exc)`` as one
line and exit non-zero.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DynresError(Exception):
    """Base class of every error dynres raises on purpose."""


class ConfigError(DynresError, ValueError):
    """A configuration or scenario value is missing, unknown or out of range."""


class PolicyError(DynresError):
    """Base class of errors about finding, loading or validating a policy."""


class PolicyNotFoundError(PolicyError, LookupError):
    """No installed policy has the requested name."""


class DuplicatePolicyError(PolicyError):
    """Two installed distributions register a policy under the same name."""


class PolicyImportError(PolicyError, ImportError):
    """A policy or plugin entry point failed to import."""


class PolicyValidationError(PolicyError, TypeError):
    """A policy class or plugin does not satisfy the policy API (type, signature, hook name)."""


class PolicyParamsError(PolicyError, ValueError):
    """A policy's params do not validate against its ``Params`` model."""


class PluginError(DynresError):
    """A plugin from the ``dynres.plugins`` group failed to load or validate."""


class MetricsError(DynresError, ValueError):
    """Recorded numbers handed to a metric formula are inconsistent (lengths, time order)."""


class RuntimeStateError(DynresError, RuntimeError):
    """An operation was requested in a controller or queue state that does not allow it."""


class RunStalledError(RuntimeStateError):
    """A run made no progress (no sample generated or trained, no transition) for too long."""


class RunAbortedError(DynresError):
    """A run ended before its cycles were done because of a fault or an interrupt.

    ``report`` holds the run's report (its ``checkpoint`` resumes the run without losing a
    sample, when it could be written); ``exit_code`` is what a command line should exit with
    (130 after KeyboardInterrupt, 2 otherwise).
    """

    def __init__(self, message: str, *, report: object = None, exit_code: int = 2) -> None:
        """Build the error from its one-line message, the run's report and the exit code."""
        super().__init__(message)
        self.report = report
        self.exit_code = exit_code


class BackendError(DynresError):
    """A backend operation (replica, train engine, cluster) failed."""


class BackendTimeoutError(BackendError, TimeoutError):
    """A backend operation did not finish within its timeout."""


class ReplicaUnavailableError(BackendError):
    """A request could not be routed because no replica is available."""


class MissingExtraError(DynresError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, module: str, extra: str, distribution: str = "dynres-runtime") -> None:
        """Build the message for a missing ``module`` installed by ``distribution[extra]``."""
        super().__init__(
            f"{module!r} is not installed; it is needed for this feature. "
            f"Install it with: pip install '{distribution}[{extra}]'"
        )
        self.module = module
        self.extra = extra


class ScenarioError(ConfigError):
    """A simulator scenario or preset is invalid or unknown."""


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
