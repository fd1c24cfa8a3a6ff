#!/usr/bin/env bash
# The runner on GloVe under every metric (#21): unit-normalised GloVe under l2sq, cosine
# and ip (on unit vectors the three rank alike, so their recall and hit ratios should
# agree), and raw GloVe under ip. Exact backend; paper-Aker, the baselines and akerd's
# configuration (ops/akerd.toml less its metric line, so that --metric applies).
#   bash ops/recall-metrics.sh [OUT]          # default bench/results/metrics
#   WHAT=unit bash ops/recall-metrics.sh      # only the unit-normalised runs (WHAT=raw: raw ip)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/metrics}
mkdir -p "$out" target
sed '/^metric = /d' ops/akerd.toml > target/akerd-any-metric.toml
cargo build -p bench --release
bench=target/release/bench
run() {
  local name=$1; shift
  echo "== $name: $*"
  /usr/bin/time -f "$name: %e s" "$bench" recall --dataset glove --backend exact \
    --akerd-config target/akerd-any-metric.toml --out "$out/$name" "$@"
}
what=${WHAT:-"unit raw"}
if [[ $what == *unit* ]]; then
  for m in l2sq cosine ip; do
    run "glove-unit-$m" --normalize --metric "$m"
  done
fi
if [[ $what == *raw* ]]; then
  run glove-ip --metric ip
fi
