#!/usr/bin/env bash
# Runs a command (the test suite) with a system Chromium for the dashboard's browser test.
#
#   scripts/test-chromium.sh COMMAND [ARGS...]
#
# Chromium is Debian's `chromium` package, driven by Playwright through its executable path (no browser download).
# It is looked up as $FITEVICT_TEST_CHROMIUM, then chromium / chromium-browser on PATH. As root with apt-get the
# package is installed when none is found (once; later runs reuse it), and then it must work: failing to install it
# is an error. Elsewhere a missing Chromium only skips the browser test, with the reason in
# FITEVICT_TEST_CHROMIUM_SKIP.
#
#   FITEVICT_TEST_CHROMIUM=/path/to/chromium   use that browser
#   FITEVICT_TEST_CHROMIUM=off                 skip the browser test
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

skip_chromium() {  # skip_chromium REASON COMMAND [ARGS...]
  export FITEVICT_TEST_CHROMIUM_SKIP="$1"
  unset FITEVICT_TEST_CHROMIUM
  say "the dashboard's browser test will be skipped: $1"
  shift
  exec "$@"
}

find_chromium() {
  local c
  for c in chromium chromium-browser; do
    command -v "$c" 2>/dev/null && return 0
  done
  return 1
}

if [ "${FITEVICT_TEST_CHROMIUM:-}" = off ]; then
  skip_chromium "FITEVICT_TEST_CHROMIUM=off" "$@"
fi
if [ -n "${FITEVICT_TEST_CHROMIUM:-}" ]; then
  [ -x "$FITEVICT_TEST_CHROMIUM" ] || { echo "FITEVICT_TEST_CHROMIUM=$FITEVICT_TEST_CHROMIUM is not an executable" >&2; exit 1; }
  exec "$@"
fi
if ! BIN=$(find_chromium); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Chromium for the dashboard's browser test (apt-get install chromium; once)"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends chromium; then
      apt-get update -q
      apt-get install -y -q --no-install-recommends chromium
    fi
    BIN=$(find_chromium) || { echo "apt-get installed chromium but no chromium is on PATH" >&2; exit 1; }
  else
    skip_chromium "no chromium on PATH, and not root with apt-get to install it; install Debian's chromium package or set FITEVICT_TEST_CHROMIUM" "$@"
  fi
fi
export FITEVICT_TEST_CHROMIUM="$BIN"
say "dashboard browser test: $("$BIN" --version 2>/dev/null || echo "$BIN")"
exec "$@"
