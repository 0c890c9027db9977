#!/usr/bin/env bash
# The tier under load for a long time: tests/chaos.rs with its duration raised. Several
# `granary read` processes stream epochs through one tier while a chaos loop SIGKILLs a random
# one every 50-400 ms; the run fails on any short epoch, any wrong byte, the quota exceeded
# (sampled continuously under the tier's lock), leaked temporary files or `cache stats`
# disagreeing with the files. Prints the figures docs/testing.md reports.
#
#   bash scripts/chaos.sh [SECONDS] [READERS] [SEED]     # defaults: 300 s, 4 readers, seed 1
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-300}
readers=${2:-4}
seed=${3:-1}
for v in "$secs" "$readers" "$seed"; do
  if ! [[ $v =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/chaos.sh [SECONDS] [READERS] [SEED]  (non-negative integers)" >&2
    exit 2
  fi
done
GRANARY_CHAOS_SECONDS=$secs GRANARY_CHAOS_READERS=$readers GRANARY_CHAOS_SEED=$seed \
  cargo test --release --test chaos -- --nocapture
