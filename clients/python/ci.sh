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
if [ ! -x "$venv/bin/python" ]; then
  timeout 120 python3 -m venv "$venv"
fi
timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here" pytest

cd "$here"
set +e
timeout 600 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests
rc=$?
set -e
echo "clients/python: $(( $(date +%s) - start )) s (pytest exit $rc)"
exit "$rc"
