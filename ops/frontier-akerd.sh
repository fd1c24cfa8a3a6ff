#!/usr/bin/env bash
# akerd's cache configuration (ops/akerd.toml: 2 shards, 2 filter candidates, learned
# standby search) at the bytes paper-Aker's default takes (#22), under variants of its
# policy, eviction, Δ and kept vectors. GloVe, exact backend; each variant is
# ops/akerd.toml with those four lines replaced ("default" is the file as shipped).
# ~2.5 min with ground truth cached. The table: python3 ops/frontier_akerd_summary.py
#   bash ops/frontier-akerd.sh [OUT]       # default bench/results/frontier-akerd
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/frontier-akerd}
mkdir -p "$out" target/akerd-variants
cargo build -p bench --release
aker='{ kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
rerank='{ kind = "aker_rerank", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
guarded4='{ kind = "guarded", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
guarded2='{ kind = "guarded", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 2.0 }'
# variant: policy eviction delta store_vectors (the akerd defaults before #22: Δ 10, kept)
declare -A variant=(
  [aker]="aker fifo 10 true"
  [rerank]="rerank fifo 10 true"
  [guarded4]="guarded4 fifo 10 true"
  [guarded2]="guarded2 fifo 10 true"
  [aker-clock]="aker second_chance 10 true"
  [rerank-clock]="rerank second_chance 10 true"
  [guarded4-clock]="guarded4 second_chance 10 true"
  [guarded4-clock-ids-d0]="guarded4 second_chance 0 false"
)
for v in aker rerank guarded4 guarded2 aker-clock rerank-clock guarded4-clock guarded4-clock-ids-d0 default; do
  if [ "$v" = default ]; then
    cp ops/akerd.toml "target/akerd-variants/$v.toml"
  else
    read -r p eviction delta vectors <<< "${variant[$v]}"
    sed -e "s|^policy = .*|policy = ${!p}|" \
        -e "s|^eviction = \"[a-z_]*\"|eviction = \"$eviction\"|" \
        -e "s|^delta = [0-9]*|delta = $delta|" \
        -e "s|^store_vectors = [a-z]*|store_vectors = $vectors|" \
        ops/akerd.toml > "target/akerd-variants/$v.toml"
  fi
  echo "== $v"
  target/release/bench recall --dataset glove --backend exact --equal-bytes \
    --akerd-config "target/akerd-variants/$v.toml" --policies aker,none --out "$out/$v"
done
