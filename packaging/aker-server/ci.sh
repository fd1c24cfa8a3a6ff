#!/usr/bin/env bash
# The server wheel as a user gets it, a stage of .ci/run (from the repository root):
# build it (build.sh), install it into a fresh venv, run `akerd --demo`, then one round
# trip against an akerd from the wheel: aker-cli ping and a search with the Python
# client (the aker-client wheel clients/python/ci.sh built, else the source tree).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
start=$(date +%s)
bash packaging/aker-server/build.sh
whl=$(ls target/aker-server-dist/aker_server-*.whl)
venv=$root/target/aker-server-venv
rm -rf "$venv"
timeout 120 python3 -m venv "$venv"
client=$(ls target/py-client-dist/aker_client-*.whl 2>/dev/null | head -1 || true)
timeout 600 "$venv/bin/pip" install --quiet --disable-pip-version-check "$whl" "${client:-./clients/python}"
[ -x "$venv/bin/akerd" ] && [ -x "$venv/bin/aker-cli" ] || { echo "aker-server: akerd / aker-cli not on the venv's PATH" >&2; exit 1; }
t=$(date +%s)
timeout 300 "$venv/bin/akerd" --demo > target/aker-server-dist/demo.txt 2>&1
grep -q "errors 0" target/aker-server-dist/demo.txt || { cat target/aker-server-dist/demo.txt >&2; exit 1; }
echo "aker-server: akerd --demo from the wheel in $(( $(date +%s) - t )) s"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cfg=target/aker-server-dist/akerd.toml
cat > "$cfg" <<TOML
[server]
listen = "127.0.0.1:$port"
executors = 1
[backend]
data = { kind = "synthetic", n = 2000, dim = 16, clusters = 8, seed = 7 }
[admin]
enabled = false
TOML
"$venv/bin/akerd" --config "$cfg" > target/aker-server-dist/akerd.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  grep -q "akerd: ready" target/aker-server-dist/akerd.log && break
  kill -0 $pid 2>/dev/null || { cat target/aker-server-dist/akerd.log >&2; exit 1; }
  sleep 0.1
done
grep -q "akerd: ready" target/aker-server-dist/akerd.log || { echo "aker-server: akerd not ready in 30 s" >&2; cat target/aker-server-dist/akerd.log >&2; exit 1; }
timeout 10 "$venv/bin/aker-cli" --target "127.0.0.1:$port" ping
timeout 60 "$venv/bin/python" - "$port" <<'PY'
import sys
import time
import numpy as np
import aker
with aker.Client("127.0.0.1", int(sys.argv[1])) as c:
    q = np.full(c.info.dim, 0.5, dtype=np.float32)
    first = c.search(q, 5)
    # Admission is the shard owner's, asynchronous: the next search may miss again.
    deadline = time.monotonic() + 5.0
    while True:
        again = c.search(q, 5)
        if again.kind != aker.HitKind.MISS or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(first.ids) == 5 and list(again.ids) == list(first.ids), (first, again)
    assert again.kind != aker.HitKind.MISS, again.kind
    print(f"aker-server: a search through the wheel's akerd: {first.kind.name} then {again.kind.name}")
PY
kill -TERM $pid
wait $pid
trap - EXIT
echo "aker-server: $(( $(date +%s) - start )) s in all"
