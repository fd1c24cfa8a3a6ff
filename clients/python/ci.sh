#!/usr/bin/env bash
# The Python client's tests, as .ci/run calls them from the repository root:
#
#   bash clients/python/ci.sh
#
# A venv in target/py-client-venv, the package (./clients/python) and pytest installed
# into it, the tests run against target/debug/akerd ($AKERD overrides; built with cargo
# only when absent). Every step is bounded in time. About 20-40 s once akerd is built.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
start=$(date +%s)

export AKERD="${AKERD:-$root/target/debug/akerd}"
if [ ! -x "$AKERD" ]; then
  echo "clients/python: no akerd at $AKERD; cargo build --bin akerd"
  timeout 1500 cargo build --bin akerd
fi

venv="$root/target/py-client-venv"
# A venv a killed run left half made is made again.
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
  if ! timeout 120 python3 -m venv "$venv"; then
    # Debian and Ubuntu ship venv's pip separately.
    rm -rf "$venv"
    if command -v apt-get >/dev/null 2>&1; then
      pyver=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt-get install -y -qq "python$pyver-venv" >/dev/null || apt-get install -y -qq python3-venv >/dev/null
    fi
    timeout 120 python3 -m venv "$venv"
  fi
fi
# numpy, pytest and the build backend come from PyPI: this stage needs the network.
if ! timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here" pytest; then
  echo "clients/python: pip could not install the package and pytest (is PyPI reachable?)" >&2
  exit 1
fi

cd "$here"
set +e
timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests
rc=$?
set -e
echo "clients/python: $(( $(date +%s) - start )) s (pytest exit $rc)"
exit "$rc"
