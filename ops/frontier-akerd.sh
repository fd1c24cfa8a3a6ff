#!/usr/bin/env bash
# akerd's cache configuration (ops/akerd.toml: Δ = 10, vectors kept, 2 shards) at the
# bytes paper-Aker's default takes, under four policies (#22): aker, aker_rerank,
# guarded (minD / 4 and / 2), and three of them with second-chance eviction. GloVe, exact backend; each variant is ops/akerd.toml with
# its policy line replaced. ~5 min with ground truth cached.
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
policy[aker-clock]=${policy[aker]}
policy[rerank-clock]=${policy[rerank]}
policy[guarded4-clock]=${policy[guarded4]}
for v in aker rerank guarded4 guarded2 aker-clock rerank-clock guarded4-clock; do
  eviction=fifo
  [[ $v == *-clock ]] && eviction=second_chance
  sed -e "s|^policy = .*|policy = ${policy[$v]}|" \
      -e "s|^eviction = \"[a-z_]*\"|eviction = \"$eviction\"|" ops/akerd.toml > "target/akerd-variants/$v.toml"
  echo "== $v"
  target/release/bench recall --dataset glove --backend exact --equal-bytes \
    --akerd-config "target/akerd-variants/$v.toml" --policies aker,none --out "$out/$v"
done
