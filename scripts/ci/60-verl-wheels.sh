#!/usr/bin/env bash
# CI check: dynres-verl from built wheels in a fresh venv. `pip install dynres-verl` brings verl;
# then `import verl` registers every dynres policy in verl's registry as dynres:<name>, and verl's
# own build_policy builds dynres:default and dynres:fixed_ratio; verl:default resolves in dynres.
# ci-lane: beside-lint (scripts/test.sh runs it beside lint: it judges no timing)
set -euo pipefail
source "$(dirname "$0")/_lib.bash"
ci_setup 60-verl-wheels
start=$SECONDS

say "building wheels"
for pkg in dynres-core dynres-policies dynres-verl; do build_wheel "packages/$pkg"; done
"$BUILD_PY" - "$WHEELS" <<'EOF_PY'
import pathlib, sys, zipfile
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    assert "dynres/__init__.py" not in zipfile.ZipFile(wheel).namelist(), f"{wheel.name} ships dynres/__init__.py"
EOF_PY

say "installing dynres-verl (and verl) into a fresh venv"
"$PY" -m venv "$TMP/venv"
VPY=$TMP/venv/bin/python
# --no-compile: byte-compiling every file of torch and friends costs more than the check itself.
PIP=("$VPY" -m pip install --disable-pip-version-check -q --no-compile)
# The CPU build of torch first: verl depends on torch, and an unpinned torch is the CUDA build.
"${PIP[@]}" "torch==2.13.0" || { say "FAILED: installing CPU torch"; exit 1; }
"${PIP[@]}" --find-links "$WHEELS" "$WHEELS"/*.whl || { say "FAILED: pip install of the wheels"; exit 1; }
say "installed in $((SECONDS - start)) s"

say "checking"
cd "$TMP"
env -u PYTHONPATH -u VERL_USE_EXTERNAL_PLUGINS DYNRES_DISABLE_PLUGIN_AUTOLOAD= RAY_AUTH_MODE=disabled "$VPY" - <<'EOF_PY'
import contextlib, io, json, sys
import importlib.metadata as md

import verl
from verl.experimental.fully_async_policy.dynamic_schedule import DynamicScheduleContext, base, build_policy

from dynres.core import installed_policies, resolve_policy_class

assert md.version("verl").startswith("0.9."), md.version("verl")
names = sorted(base._policy_registry)
print("verl", md.version("verl"), "registry after import verl:", json.dumps(names))
for name in installed_policies():
    assert f"dynres:{name}" in names, (name, names)
assert {"default", "static_fully_async"} <= set(names), names

ctx = DynamicScheduleContext(required_samples=8, trigger_parameter_sync_step=2, total_generated_samples=0,
                             expected_samples=0, buffer_samples=0)
for name in ("dynres:default", "dynres:fixed_ratio"):
    pol = build_policy(name, deactivate_ratio=0.5, only_hybrid=False)
    assert pol.should_deactivate(1, True, ctx) is True
    assert pol.deactivate_wait_samples(ctx) == 8, name
    assert pol.should_activate_after_step(1, False, ctx) is True, name
    pol.update_after_step(1, ctx)
only = build_policy("dynres:default", deactivate_ratio=0.5, only_hybrid=True)
assert only.should_deactivate(1, True, ctx) and only.deactivate_wait_samples(ctx) == 16

cls = resolve_policy_class("verl:default")
with contextlib.redirect_stdout(io.StringIO()):
    assert cls.name == "verl_default" and cls().deactivate_wait_samples.__self__ is not None
print("checked: dynres:default, dynres:fixed_ratio through build_policy; verl:default ->", cls.__name__)
EOF_PY
say "OK in $((SECONDS - start)) s (removing the venv follows)"
