"""Params of a dynres policy inside a verl run, passed without editing verl.

verl builds a policy with ``deactivate_ratio`` and ``only_hybrid`` only. Any other params of the
dynres policy come from the environment variable ``DYNRES_VERL_PARAMS``: either a path to a
YAML or JSON file, or an inline YAML/JSON mapping, holding the policy's ``Params`` (for example
``DYNRES_VERL_PARAMS='{"min_ratio": 0.1}'``). Explicit params win over verl's
``deactivate_ratio``, the same rule as ``dynamic_schedule_deactivate_ratio`` in a dynres config.
Errors are the one-line :class:`~dynres.core.errors.ConfigError` /
:class:`~dynres.core.errors.PolicyParamsError` used everywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dynres.core import Policy
from dynres.core.config import read_yaml
from dynres.core.errors import ConfigError

PARAMS_ENV = "DYNRES_VERL_PARAMS"
"""Environment variable holding the dynres policy's params (a file path or an inline mapping)."""


def params_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the params mapping ``DYNRES_VERL_PARAMS`` holds ({} when unset or empty)."""
    raw = (os.environ if environ is None else environ).get(PARAMS_ENV, "").strip()
    if not raw:
        return {}
    if raw[0] in "{[" or "\n" in raw:
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(
                f"{PARAMS_ENV}: invalid inline YAML/JSON ({problem}); give a mapping like "
                "'{\"min_ratio\": 0.1}' or the path of a YAML/JSON file"
            ) from None
        source = f"{PARAMS_ENV} (inline)"
    else:
        path = Path(raw).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{PARAMS_ENV}={raw!r}: no such file; give the path of a YAML/JSON file holding the "
                "policy's params, or an inline mapping like '{\"min_ratio\": 0.1}'"
            )
        data = read_yaml(path)  # JSON is YAML, so one reader covers both
        source = f"{PARAMS_ENV} file {str(path)!r}"
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source} holds a {type(data).__name__}; it must be a mapping of the policy's params")
    return dict(data)


def build_params(
    cls: type[Policy], *, deactivate_ratio: float | None, environ: Mapping[str, str] | None = None
) -> Policy.Params:
    """Validated params of ``cls`` for a verl run: ``DYNRES_VERL_PARAMS``, then verl's ratio.

    verl's ``deactivate_ratio`` fills the field of that name when the policy has one and the
    environment did not set it; raises PolicyParamsError naming a bad or unknown key.
    """
    params = params_from_env(environ)
    if deactivate_ratio is not None and "deactivate_ratio" in cls.Params.model_fields:
        params.setdefault("deactivate_ratio", deactivate_ratio)
    return cls.validate_params(params)
