#!/usr/bin/env bash
# Installs what Sandpit needs on a fresh Debian machine: system packages and the virtualenv.
# Usage: scripts/setup.sh [--dev]   (--dev adds test tools: chromium, docker, debootstrap)
set -euo pipefail
cd "$(dirname "$0")/.."

want_dev=0
[ "${1:-}" = "--dev" ] && want_dev=1

packages=(bubblewrap slirp4netns nftables)
# runsc: the docker tests run a second time under gVisor; fuse3: tests/slow_disk.py.
[ $want_dev = 1 ] && packages+=(chromium docker.io docker-compose debootstrap runsc fuse3)

missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "==> installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "Missing system packages: ${missing[*]}. Install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.sandpit-installed
extras=""
# The test suite also builds every cloud adapter, so it installs their SDKs too.
[ $want_dev = 1 ] && extras="[dev,cloud]"
installed_extras=$(cat "$stamp" 2>/dev/null || echo none)
# An install with the dev extras also serves a plain run.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ clients/python/pyproject.toml -nt "$stamp" ] || { [ "$installed_extras" != "$extras" ] && [ "$installed_extras" != "[dev,cloud]" ]; }; then
  echo "==> installing Python dependencies$extras"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".$extras"
  # The Python SDK and `sandpit` CLI (clients/python), editable: tests/sdk drives them.
  [ $want_dev = 1 ] && .venv/bin/pip install -q -e ./clients/python
  echo "$extras" > "$stamp"
fi
