#!/usr/bin/env bash
# Installs what the tests need (nothing beyond the Rust toolchain, tar and sh so far) and runs
# every quality gate: formatting, clippy with warnings as errors, and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
if ! need tar; then
  echo "installing tar" >&2
  apt-get update -qq && apt-get install -y -qq tar
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# One closing line with the totals over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
