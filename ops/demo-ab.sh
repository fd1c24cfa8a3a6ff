#!/usr/bin/env bash
# A / B of two akerd builds on the demo: alternated runs (A B A B ...), then one A / A
# pair for the noise floor. Prints one line a run: throughput and the server's p50 for
# exact and approximate hits, from the demo's own table.
#   usage: ops/demo-ab.sh AKERD_A AKERD_B [ROUNDS (3)] > runs.txt
set -euo pipefail
a=$1; b=$2; rounds=${3:-3}
run() { # label binary
  local out
  out=$("$2" --demo 2>/dev/null)
  local tput exact approx
  tput=$(grep -oP 'throughput \K[0-9]+' <<<"$out")
  exact=$(awk '$1=="exact"{print $(NF-2)}' <<<"$out")
  approx=$(awk '$1=="approximate"{print $(NF-2)}' <<<"$out")
  echo "$1 searches_per_s=$tput exact_server_p50_us=$exact approx_server_p50_us=$approx"
}
for _ in $(seq "$rounds"); do run A "$a"; run B "$b"; done
run A "$a"; run A2 "$a"
