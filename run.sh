#!/usr/bin/env bash
# fitevict's one entry point for people and CI. Idempotent: each step is skipped when already done.
#   ./run.sh serve [fitevict serve flags]   set up, then serve (demo zoo when you have no models)
#   ./run.sh test  [pytest args]            set up, then run the whole test suite (unit + e2e; the Vulkan build too)
#   ./run.sh setup                          set up only: system packages, venv, llama.cpp's CPU build
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_system() {
  local need=()
  "$PY" -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
  command -v cmake >/dev/null || need+=(cmake)
  { command -v c++ || command -v g++; } >/dev/null || need+=(g++)
  command -v make >/dev/null || need+=(make)
  command -v git >/dev/null || need+=(git)
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      say "installing system packages: ${need[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get update -q
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
    else
      echo "fitevict needs these system packages: ${need[*]} (install them, e.g. sudo apt-get install -y ${need[*]})" >&2
      exit 1
    fi
  fi
}

ensure_venv() {
  local want stamp="$VENV/.fitevict-installed"
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return
  fi
  say "creating the virtual environment in $VENV"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # The torch extra (transformers seats) only with a CPU build of torch at hand: a torch-2.13.0+cpu wheel in a
  # PIP_FIND_LINKS directory, or PIP_INDEX_URL naming a CPU wheel index. Never CUDA wheels on a CPU machine.
  local extras=test,ray
  if compgen -G "${PIP_FIND_LINKS:-/nonexistent}/torch-2.13.0+cpu-*.whl" >/dev/null || [ -n "${PIP_INDEX_URL:-}" ]; then
    extras=test,ray,torch
  else
    say "no CPU torch wheel (PIP_FIND_LINKS) or index (PIP_INDEX_URL): skipping the torch extra; transformers seats and their tests need it"
  fi
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  echo "$want" > "$stamp"
}

ensure_engine() {
  # Returns within seconds when the pinned build is already in the cache.
  "$VENV/bin/fitevict" engine install llama.cpp
}

with_test_systems() {
  # Runs "$@" beside a throwaway PostgreSQL (installed through apt once when root), so the store tests cover both
  # backends; the server stops when "$@" ends. Without root or PostgreSQL those tests skip and say why.
  # Chromium (Debian's package, installed through apt once when root) drives the dashboard's browser test.
  # llama.cpp's Vulkan build (its packages installed through apt once when root, then built into the cache once:
  # 12 to 28 minutes on 2 cores) runs the device tests on a real Vulkan device (lavapipe without a GPU).
  FITEVICT_PYTHON="$VENV/bin/python" PYTHON="$PY" exec bash "$ROOT/scripts/test-vulkan.sh" \
    bash "$ROOT/scripts/test-chromium.sh" bash "$ROOT/scripts/test-postgres.sh" "$@"
}

cmd=${1:-serve}
[ $# -gt 0 ] && shift
case "$cmd" in
  setup)
    ensure_system; ensure_venv; ensure_engine ;;
  serve)
    ensure_system; ensure_venv; ensure_engine
    exec "$VENV/bin/fitevict" serve --demo-if-empty "$@" ;;
  test)
    ensure_system; ensure_venv; ensure_engine
    say "running the test suite (unit + e2e with real llama-server)"
    with_test_systems "$VENV/bin/python" -m pytest "$@" ;;
  *)
    echo "usage: ./run.sh serve|test|setup [args]" >&2; exit 2 ;;
esac
