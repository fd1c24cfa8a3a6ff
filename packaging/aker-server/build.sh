#!/usr/bin/env bash
# Builds the aker-server wheel into target/aker-server-dist and checks what a user gets:
# the manylinux tag (auditwheel), both binaries stripped, the size. The tools (maturin,
# ziglang, auditwheel) go into target/wheel-tools. From anywhere:
#
#   bash packaging/aker-server/build.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
tools=$root/target/wheel-tools
out=$root/target/aker-server-dist
if ! "$tools/bin/maturin" --version >/dev/null 2>&1; then
  rm -rf "$tools"
  timeout 120 python3 -m venv "$tools"
  timeout 600 "$tools/bin/pip" install --quiet --disable-pip-version-check \
    "maturin==1.16.0" "ziglang==0.17.1" "auditwheel==6.8.2"
fi
rm -rf "$out"
t=$(date +%s)
# ziglang's zig is what `--zig` links with, against glibc 2.28 (manylinux_2_28): glommio
# calls copy_file_range, which glibc has from 2.27, so manylinux2014 (2.17) cannot link.
# No line tables: the binaries are stripped anyway, and the build is shorter.
( cd packaging/aker-server && CARGO_PROFILE_RELEASE_DEBUG=0 PATH="$tools/bin:$PATH" timeout 1500 maturin build --release --zig \
    --out "$out" )
echo "aker-server: wheel built in $(( $(date +%s) - t )) s"
whl=$(ls "$out"/aker_server-*.whl)
bytes=$(stat -c %s "$whl")
echo "aker-server: $(basename "$whl"), $((bytes / 1024 / 1024)) MiB ($bytes bytes)"
# Well under PyPI's 100 MB per file.
[ "$bytes" -lt $((50 * 1024 * 1024)) ] || { echo "aker-server: the wheel is over 50 MiB" >&2; exit 1; }
# The platform tag says which glibc it needs; auditwheel checks the binaries agree.
"$tools/bin/auditwheel" show "$whl" | tee "$out/auditwheel.txt"
# The tag auditwheel computes from the binaries' symbols (not the file name's): glibc
# 2.28 at most.
tag=$(tr '\n' ' ' < "$out/auditwheel.txt" | grep -o 'platform tag: *"[^"]*"' | head -1 | sed 's/.*"\(.*\)"/\1/')
glibc_minor=$(echo "$tag" | sed -n 's/^manylinux_2_\([0-9]*\)_x86_64$/\1/p')
[ -n "$glibc_minor" ] && [ "$glibc_minor" -le 28 ] || { echo "aker-server: auditwheel says '$tag', not manylinux_2_28 or older" >&2; exit 1; }
echo "aker-server: auditwheel: $tag"
# Stripped: no symbol table left in either binary.
unpacked=$out/unpacked
mkdir -p "$unpacked" && (cd "$unpacked" && python3 -m zipfile -e "$whl" .)
for b in akerd aker-cli; do
  f=$(find "$unpacked" -path "*scripts/$b" -type f)
  [ -n "$f" ] || { echo "aker-server: $b is missing from the wheel" >&2; exit 1; }
  if readelf -S "$f" | grep -q '\.symtab'; then echo "aker-server: $b is not stripped" >&2; exit 1; fi
  echo "aker-server: $b $(( $(stat -c %s "$f") / 1024 / 1024 )) MiB, stripped"
done
