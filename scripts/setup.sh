#!/usr/bin/env bash
# Installs what evalsite needs on a fresh Debian machine with python3 and node, idempotently:
# uv, the locked Python packages, the npm packages, bubblewrap (the code sandbox) and, with
# --browser, Debian's Chromium for the browser tests. Sourced by run.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

want_browser=0
for arg in "$@"; do [ "$arg" = "--browser" ] && want_browser=1; done

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || return 1
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq || return 1; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v uv >/dev/null 2>&1; then
  if [ ! -x .tools/bin/uv ]; then
    echo "Installing uv into .tools/ ..."
    python3 -m venv .tools >/dev/null 2>&1 || { apt_install python3-venv && python3 -m venv .tools; }
    .tools/bin/pip install -q uv
  fi
  export PATH="$PWD/.tools/bin:$PATH"
fi

uv sync --frozen --quiet

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "Installing npm packages ..."
  npm ci --no-audit --no-fund --loglevel=error
fi

if ! command -v bwrap >/dev/null 2>&1; then
  echo "Installing bubblewrap (the code evaluator sandbox) ..."
  apt_install bubblewrap || echo "WARNING: bubblewrap is missing and could not be installed; code evaluators will report it." >&2
fi

if [ "$want_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "Installing Chromium for the browser tests ..."
  apt_install chromium || echo "WARNING: chromium could not be installed; browser tests will be skipped." >&2
fi
