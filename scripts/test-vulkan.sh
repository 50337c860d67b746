#!/usr/bin/env bash
# Runs a command (the test suite) with llama.cpp's Vulkan build in fitevict's cache, so the device tests run on a
# real Vulkan device: a GPU where there is one, else Mesa's lavapipe (a Vulkan device that runs on the CPU).
#
#   scripts/test-vulkan.sh COMMAND [ARGS...]
#
# The build needs the Debian packages mesa-vulkan-drivers libvulkan-dev glslc spirv-headers (fitevict names what is
# missing: engines/llama_cpp/vulkan.py). As root with apt-get the missing ones are installed (once; later runs
# reuse them). With them present the Vulkan build is built into the cache once (`fitevict engine install llama.cpp
# --vulkan`: 12 to 28 minutes on 2 cores; later runs find it in seconds), and then it must succeed: a failed build
# is an error. Elsewhere missing packages only skip the Vulkan tests, with the reason in FITEVICT_TEST_VULKAN_SKIP.
#
#   FITEVICT_PYTHON=/path/to/venv/python   the Python that has fitevict installed (default: python3)
#   FITEVICT_TEST_VULKAN=off               neither install nor build: the Vulkan tests skip
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
PY=${FITEVICT_PYTHON:-python3}

missing_packages() {  # the Debian packages for what the Vulkan build still lacks here, space-separated
  "$PY" -c 'from fitevict.engines.llama_cpp import vulkan
print(" ".join(sorted({p for _, p in vulkan.missing()})))'
}

skip=""  # why the Vulkan tests skip, when they do
need=""
if [ "${FITEVICT_TEST_VULKAN:-}" = off ]; then
  skip="FITEVICT_TEST_VULKAN=off"
else
  need=$(missing_packages)
fi
if [ -n "$need" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    printf '\033[1m==> %s\033[0m\n' "installing the Vulkan build's packages for the device tests (apt-get install $need; once)" >&2
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086  # one word per package
    apt-get install -y -q --no-install-recommends $need || {
      apt-get update -q
      # shellcheck disable=SC2086
      apt-get install -y -q --no-install-recommends $need
    }
    need=$(missing_packages)
    [ -z "$need" ] || { echo "apt-get installed the Vulkan packages but fitevict still misses: $need" >&2; exit 1; }
  else
    skip="the Vulkan build needs the Debian packages $need (not root with apt-get to install them)"
  fi
fi
if [ -n "$skip" ]; then
  export FITEVICT_TEST_VULKAN_SKIP="$skip"
  printf '\033[1m==> %s\033[0m\n' "the Vulkan build's tests will be skipped: $skip" >&2
else
  # seconds when the build is in the cache; the first time, the whole Vulkan build (its progress goes to stderr)
  "$PY" -m fitevict.cli engine install llama.cpp --vulkan
fi
exec "$@"
