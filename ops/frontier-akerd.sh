#!/usr/bin/env bash
# akerd's cache configuration (ops/akerd.toml: Δ = 10, vectors kept, 2 shards) at the
# bytes paper-Aker's default takes, under four policies (#22): aker, aker_rerank,
# guarded (minD / 4 and / 2). GloVe, exact backend; each variant is ops/akerd.toml with
# its policy line replaced. ~3 min with ground truth cached.
#   bash ops/frontier-akerd.sh [OUT]       # default bench/results/frontier-akerd
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/frontier-akerd}
mkdir -p "$out" target/akerd-variants
cargo build -p bench --release
declare -A policy=(
  [aker]='{ kind = "aker", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
  [rerank]='{ kind = "aker_rerank", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
  [guarded4]='{ kind = "guarded", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 4.0 }'
  [guarded2]='{ kind = "guarded", alpha_l = 1.1, alpha_t = 0.25, tau_init_divisor = 2.0 }'
)
for v in aker rerank guarded4 guarded2; do
  sed "s|^policy = .*|policy = ${policy[$v]}|" ops/akerd.toml > "target/akerd-variants/$v.toml"
  echo "== $v"
  target/release/bench recall --dataset glove --backend exact --equal-bytes \
    --akerd-config "target/akerd-variants/$v.toml" --policies aker,none --out "$out/$v"
done
