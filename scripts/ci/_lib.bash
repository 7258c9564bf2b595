# Shared by the scripts/ci/*.sh checks (sourced, never run: its name does not end in .sh).
# ci_setup NAME: cd to the repo root; set ROOT, BUILD_PY (the dev venv's python), PY (a Python
# 3.11 for fresh venvs), TMP (removed on exit) and WHEELS; define say, fail and build_wheel.
ci_setup() {
  CI_NAME=$1
  cd "$(dirname "${BASH_SOURCE[0]}")/../.."
  ROOT=$PWD
  BUILD_PY=${BUILD_PY:-$ROOT/.venv/bin/python}
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null || PY=python3
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/dynres-$CI_NAME.XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  WHEELS=$TMP/wheels
  mkdir -p "$WHEELS"
}

say() { echo "[$CI_NAME] $*"; }
fail() { say "FAILED: $*"; exit 1; }

# build_wheel DIR: a wheel of DIR into $WHEELS. Without build isolation it reuses the dev venv's
# hatchling instead of downloading one per package; without build/hatchling, pip builds it.
build_wheel() {
  local log
  log=$TMP/build-$(basename "$1").log
  if "$BUILD_PY" -c "import build, hatchling" 2>/dev/null; then
    "$BUILD_PY" -m build --wheel --no-isolation --outdir "$WHEELS" "$1" >"$log" 2>&1 || { cat "$log"; fail "building $1"; }
  else
    "$BUILD_PY" -m pip wheel --no-deps --wheel-dir "$WHEELS" "$1" >"$log" 2>&1 || { cat "$log"; fail "building $1"; }
  fi
}
