#!/usr/bin/env bash
# The Python client's checks, as .ci/run calls them from the repository root:
#
#   bash clients/python/ci.sh
#
# 1. A tool venv in target/py-client-venv with ruff, mypy, build (and numpy, pytest for
#    their types): `ruff check` and `mypy --strict` over the sources (pyproject.toml's
#    [tool.ruff] and [tool.mypy]).
# 2. `python -m build`: the sdist and the wheel in target/py-client-dist (emptied first);
#    both must carry py.typed.
# 3. A fresh venv in target/py-client-wheel-venv (made anew each run) with the built
#    WHEEL and pytest; the tests run against that installed copy, from a directory where
#    src/ is not importable, against target/debug/akerd ($AKERD overrides; built with
#    cargo only when absent).
# 4. The floor pyproject.toml promises: the same wheel and tests on Python 3.10 with
#    numpy 1.21.6, where a Python 3.10 is found (pyenv's in this image).
# Every step is bounded in time; each part's seconds and the total are printed. PyPI must
# be reachable (the tools, numpy, the build backend). About 105 s once akerd is built (2
# cores, pip's cache warm, 2026-12-07: the pytest runs are 43 s on 3.11 and 48 s on 3.10).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
unset PYTHONPATH  # the tests must import the installed wheel, nothing else

# Pinned: a new ruff or mypy release may add checks; move these on purpose.
RUFF=ruff==0.17.6
MYPY=mypy==2.4.1
BUILD='build>=1.2'

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
start=$(now_ms)
mark=$start
timings=()
# took NAME: the time since the previous mark, printed now and again at the end.
took() {
  local t
  t=$(now_ms)
  local line
  line=$(printf '%-44s %6d.%01d s' "$1" $(( (t - mark) / 1000 )) $(( (t - mark) % 1000 / 100 )))
  echo "clients/python: $line"
  timings+=("$line")
  mark=$t
}

# A venv at $1 (made anew when it is not usable: a killed run may leave one half made).
make_venv() {
  local venv=$1
  if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    return 0
  fi
  rm -rf "$venv"
  if ! timeout 120 python3 -m venv "$venv"; then
    # Debian and Ubuntu ship venv's pip separately.
    rm -rf "$venv"
    if command -v apt-get >/dev/null 2>&1; then
      local pyver
      pyver=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt-get install -y -qq "python$pyver-venv" >/dev/null || apt-get install -y -qq python3-venv >/dev/null
    fi
    timeout 120 python3 -m venv "$venv"
  fi
}

pip_install() {  # pip_install VENV ARGS...: bounded, quiet, a clear message when PyPI fails
  local venv=$1
  shift
  if ! timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; then
    echo "clients/python: pip could not install $* (is PyPI reachable?)" >&2
    exit 1
  fi
}

export AKERD="${AKERD:-$root/target/debug/akerd}"
if [ ! -x "$AKERD" ]; then
  echo "clients/python: no akerd at $AKERD; cargo build --bin akerd"
  timeout 1500 cargo build --bin akerd
  took "cargo build --bin akerd"
fi

# ---------------------------------------------------------------- 1. lint and types
tools="$root/target/py-client-venv"
make_venv "$tools"
pip_install "$tools" "$RUFF" "$MYPY" "$BUILD" numpy pytest
# Earlier runs of this script installed the package itself here (as "aker"): gone, so
# that mypy sees src/ only (mypy_path) and nothing stale.
timeout 60 "$tools/bin/python" -m pip uninstall --quiet --yes aker aker-client >/dev/null 2>&1 || true
took "tool venv (ruff, mypy, build)"

cd "$here"
timeout 120 "$tools/bin/ruff" check --no-cache src tests examples bench
took "ruff check"
# [tool.mypy] names the files (src/aker, tests, examples, bench) and strict = true.
timeout 600 "$tools/bin/mypy" --strict --cache-dir "$root/target/py-client-mypy-cache"
took "mypy --strict"

# ---------------------------------------------------------------- 2. sdist and wheel
dist="$root/target/py-client-dist"
rm -rf "$dist"
timeout 600 "$tools/bin/python" -m build --outdir "$dist" "$here" >"$root/target/py-client-build.log" 2>&1 || {
  tail -n 40 "$root/target/py-client-build.log" >&2
  echo "clients/python: python -m build failed (log: target/py-client-build.log)" >&2
  exit 1
}
took "python -m build (sdist, wheel)"

# The one sdist and the one wheel, their names, sizes, py.typed and metadata.
wheel=$(timeout 60 "$tools/bin/python" - "$dist" <<'EOF'
import sys
import tarfile
import zipfile
from pathlib import Path

dist = Path(sys.argv[1])
wheels = sorted(dist.glob("aker_client-*.whl"))
sdists = sorted(dist.glob("aker_client-*.tar.gz"))
assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
wheel, sdist = wheels[0], sdists[0]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
assert "aker/py.typed" in names, "the wheel has no aker/py.typed"
assert not [n for n in names if n.startswith(("tests/", "examples/", "bench/"))], names
with tarfile.open(sdist) as t:
    members = t.getnames()
root = sdist.name[: -len(".tar.gz")]
assert f"{root}/src/aker/py.typed" in members, "the sdist has no src/aker/py.typed"
assert f"{root}/tests/conftest.py" in members, "the sdist lacks the tests' helpers (MANIFEST.in)"
for want in ("Name: aker-client", "Requires-Python: >=3.10", "Requires-Dist: numpy>=1.21"):
    assert want in meta.splitlines(), f"the wheel's METADATA lacks {want!r}"
for p in (sdist, wheel):
    print(f"clients/python: built {p.name} ({p.stat().st_size:,} bytes)", file=sys.stderr)
print(wheel)
EOF
)
took "sdist and wheel checked (py.typed, metadata)"

# ---------------------------------------------------------------- 3. the wheel's tests
wvenv="$root/target/py-client-wheel-venv"
rm -rf "$wvenv"
make_venv "$wvenv"
pip_install "$wvenv" "$wheel" pytest
took "fresh venv with the wheel and pytest"

# A directory of its own: neither src/ nor clients/python is on sys.path there.
work="$root/target/py-client-wheel-test"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
site=$(timeout 60 "$wvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
timeout 60 "$wvenv/bin/python" - "$site" <<'EOF'
import sys
from pathlib import Path

import aker

where = Path(aker.__file__).resolve()
site = Path(sys.argv[1]).resolve()
assert site in where.parents, f"aker comes from {where}, not from the wheel in {site}"
print(f"clients/python: testing aker {aker.__version__} from {where.parent}")
EOF
set +e
# conftest.py checks it again inside pytest (AKER_EXPECT_PACKAGE_IN).
AKER_EXPECT_PACKAGE_IN="$site" timeout 600 "$wvenv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests"
rc=$?
set -e
took "pytest (the installed wheel)"

# ---------------------------------------------------------------- 4. the floor
# What pyproject.toml promises at its lowest: Python 3.10 with numpy 1.21 (the oldest
# numpy with wheels for 3.10), the same wheel, the same tests. Only where a Python 3.10
# is found (this image has pyenv's); no registry here serves a CPython to install.
py310=""
for cand in python3.10 /root/.pyenv/versions/3.10*/bin/python3.10 /usr/bin/python3.10; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
    py310=$(command -v "$cand")
    break
  fi
done
if [ "$rc" -eq 0 ] && [ -n "$py310" ]; then
  fvenv="$root/target/py-client-floor-venv"
  rm -rf "$fvenv"
  timeout 120 "$py310" -m venv "$fvenv"
  pip_install "$fvenv" "$wheel" "numpy==1.21.6" pytest
  fsite=$(timeout 60 "$fvenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "clients/python: the floor: $("$fvenv/bin/python" -c 'import sys, numpy; print(f"Python {sys.version.split()[0]}, numpy {numpy.__version__}")')"
  set +e
  AKER_EXPECT_PACKAGE_IN="$fsite" timeout 600 "$fvenv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests"
  rc=$?
  set -e
  took "pytest on Python 3.10 + numpy 1.21.6"
elif [ -z "$py310" ]; then
  echo "clients/python: no Python 3.10 on this machine: the floor (3.10, numpy 1.21) not tested"
fi

echo "clients/python: seconds per part"
for line in "${timings[@]}"; do
  echo "  $line"
done
total=$(( $(now_ms) - start ))
echo "clients/python: $(( total / 1000 )).$(( total % 1000 / 100 )) s in all (pytest exit $rc)"
exit "$rc"
