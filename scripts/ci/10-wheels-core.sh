#!/usr/bin/env bash
# CI check: dynres-core + dynres-policies work from built wheels in a fresh venv (no editable
# install): the built-ins load by name with no import step, and a third-party distribution that
# registers a policy in the "dynres.policies" entry-point group is found.
# ci-lane: beside-lint (scripts/test.sh runs it beside lint: it judges no timing)
set -euo pipefail
source "$(dirname "$0")/_lib.bash"
ci_setup 10-wheels-core

say "building wheels"
build_wheel packages/dynres-core
build_wheel packages/dynres-policies

# A third-party policy package, as a plugin author would write it.
THIRD=$TMP/acme-ci-policy
mkdir -p "$THIRD/src/acme_ci_policy"
cat >"$THIRD/pyproject.toml" <<'EOF'
[build-system]
requires = ["hatchling>=1.24"]
build-backend = "hatchling.build"

[project]
name = "acme-ci-policy"
version = "0.0.1"
requires-python = ">=3.11"
dependencies = ["dynres-core"]

[project.entry-points."dynres.policies"]
acme_ci_floor = "acme_ci_policy:AcmeCiFloor"

[tool.hatch.build.targets.wheel]
packages = ["src/acme_ci_policy"]
EOF
cat >"$THIRD/src/acme_ci_policy/__init__.py" <<'EOF'
"""A throwaway third-party policy used by the wheel check."""

from pydantic import Field

from dynres.core import Policy, ScheduleContext


class AcmeCiFloor(Policy):
    """Wait for `floor` of a cycle's samples; activate while the backlog is below it."""

    name = "acme_ci_floor"

    class Params(Policy.Params):
        floor: float = Field(0.5, ge=0.0, le=1.0, description="fraction of a cycle's samples")

    def should_deactivate(self, ctx: ScheduleContext) -> bool:
        return ctx.is_hybrid_active

    def deactivate_wait_samples(self, ctx: ScheduleContext) -> int:
        return int(self.params.floor * ctx.step_required_samples)

    def should_activate_after_step(self, ctx: ScheduleContext) -> bool:
        return ctx.surplus_samples < self.params.floor * ctx.step_required_samples
EOF
build_wheel "$THIRD"

# No distribution may ship dynres/__init__.py (PEP 420 namespace package).
"$BUILD_PY" - "$WHEELS" <<'EOF'
import pathlib, sys, zipfile
wheels = sorted(pathlib.Path(sys.argv[1]).glob("*.whl"))
assert len(wheels) == 3, [w.name for w in wheels]
for wheel in wheels:
    names = zipfile.ZipFile(wheel).namelist()
    assert "dynres/__init__.py" not in names, f"{wheel.name} ships dynres/__init__.py"
EOF

say "installing into a fresh venv"
"$PY" -m venv "$TMP/venv"
VPY=$TMP/venv/bin/python
# Wheel files by path (so a same-named project on an index can never be picked instead);
# --find-links lets dynres-policies' dependency on dynres-core resolve to the local wheel.
"$VPY" -m pip install --disable-pip-version-check -q --find-links "$WHEELS" "$WHEELS"/*.whl \
  || { say "FAILED: pip install of the wheels"; exit 1; }

say "checking"
# Run from the temp dir with a clean environment so the repository cannot leak onto sys.path.
cd "$TMP"
env -u PYTHONPATH DYNRES_DISABLE_PLUGIN_AUTOLOAD= "$VPY" - <<'EOF'
import importlib.metadata as md
import json
import sys

import dynres

from dynres.core import BoundPolicy, ScheduleContext, get_plugin_manager, installed_policies, load_policy

site = next(p for p in sys.path if p.endswith("site-packages"))
for dist in ("dynres-core", "dynres-policies", "acme-ci-policy"):
    direct = md.distribution(dist).read_text("direct_url.json")
    editable = bool(direct and json.loads(direct).get("dir_info", {}).get("editable"))
    assert not editable, f"{dist} is an editable install"
assert getattr(dynres, "__file__", None) is None, "dynres must be a namespace package"
assert all(p.startswith(site) for p in dynres.__path__), f"dynres imported from {list(dynres.__path__)}"

# The built-ins: no import of dynres.policies before loading by name.
assert "dynres.policies" not in sys.modules
policy = load_policy("fixed_ratio")
assert type(policy).__module__ == "dynres.policies.fixed_ratio", type(policy)
assert sys.modules["dynres.policies.fixed_ratio"].__file__.startswith(site)
names = set(installed_policies())
assert {"default", "static_fully_async", "fixed_ratio", "acme_ci_floor"} <= names, names

# The third-party distribution.
(entry,) = installed_policies()["acme_ci_floor"]
assert (entry.distribution, entry.version) == ("acme-ci-policy", "0.0.1"), entry
third = load_policy("acme_ci_floor", {"floor": 0.25})
ctx = ScheduleContext(required_samples=8, trigger_parameter_sync_step=4,
                      num_standalone_replicas=1, num_hybrid_replicas=1, is_hybrid_active=True)
assert third.deactivate_wait_samples(ctx) == 8
bound = BoundPolicy(load_policy("default"), get_plugin_manager())
assert bound.deactivate_wait_samples(ctx) == 9 and bound.should_deactivate(ctx) is True
print("checked:", ", ".join(sorted(names)))
EOF
say "OK: dynres-core and dynres-policies wheels load fixed_ratio by name and find a third-party policy"
