#!/usr/bin/env bash
# Builds granary's Python wheels into target/wheel and prints their paths, one per line.
#
#   bash scripts/build-wheel.sh                  # this machine's architecture
#   bash scripts/build-wheel.sh x86_64 aarch64   # both (cross-built; no container needed)
#
# Each wheel holds the extension, built against the stable ABI (abi3: one wheel serves every
# CPython >= 3.9), and the `granary` command, the same version, which pip puts on PATH (the
# wheel's scripts). Both are linked by zig against glibc 2.17's symbols, so the wheel is tagged
# manylinux2014 (manylinux_2_17): it installs on RHEL / Rocky / Alma 8 and 9, CentOS 7, Ubuntu
# 18.04+, Debian 10+, SLES 15, on x86_64 and aarch64 (Grace-Hopper). maturin audits the
# extension's tag; this script checks both files' symbol versions too and refuses a wheel
# that needs a newer glibc than its tag says.
#
# The tools (maturin, ziglang, cargo-zigbuild, auditwheel) go once into a build venv,
# ~/.cache/granary/py-build;
# the Rust target of another architecture is added with rustup. CARGO_TARGET_DIR is honoured
# (scripts/test-wheels.sh keeps its cross builds outside the clone).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
# Outside the clone: cargo-zigbuild names its linker wrappers after the tools' paths, and a
# wrapper at a new path makes cargo rebuild every crate (its configuration changed).
venv=${GRANARY_BUILD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/granary/py-build}
if ! [ -x "$venv/bin/cargo-zigbuild" ] || ! [ -x "$venv/bin/maturin" ]; then
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" "ziglang>=0.13,<0.18" \
    "cargo-zigbuild>=0.19,<0.25" auditwheel >&2
fi
export PATH="$venv/bin:$PATH"
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
glibc=2.17
tag=manylinux2014
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=("$(uname -m)")
mkdir -p target/wheel
for arch in "${archs[@]}"; do
  case "$arch" in
    x86_64 | aarch64) ;;
    *) echo "build-wheel: unsupported architecture $arch (x86_64 or aarch64)" >&2; exit 2 ;;
  esac
  triple=$arch-unknown-linux-gnu
  if ! rustup target list --installed | grep -qx "$triple"; then
    rustup target add "$triple" >&2
  fi
  rm -f target/wheel/granary-*"_$arch".whl
  # The command first (its symbols stripped: it ships in the wheel), then the extension with
  # the command in the wheel's data directory (python/granary._native.data, maturin's default,
  # made here for each build and removed after it).
  # Its own target directory: its features and flags differ from the extension's, and in one
  # directory each build would evict the other's dependencies.
  CARGO_TARGET_DIR=$target_dir/wheel-cli \
    cargo-zigbuild zigbuild --profile wheel --target "$triple.$glibc" --bin granary -q >&2
  cli=$target_dir/wheel-cli/$triple/wheel/granary
  data=python/granary._native.data
  rm -rf "$data"
  mkdir -p "$data/scripts"
  cp "$cli" "$data/scripts/granary"
  maturin build --profile wheel --zig --compatibility "$tag" --target "$triple" \
    -m python/Cargo.toml --out target/wheel >&2
  rm -rf "$data"
  wheel=$(ls target/wheel/granary-*"_$arch".whl)
  # The tag is honest: no symbol of either file needs a glibc newer than it claims.
  check=$(mktemp -d)
  "$venv/bin/python" -m zipfile -e "$wheel" "$check"
  for f in "$check"/granary/_native.abi3.so "$check"/granary-*.data/scripts/granary; do
    [ -f "$f" ] || { echo "build-wheel: $(basename "$f") is missing from $wheel" >&2; exit 1; }
    newest=$("$venv/bin/python" scripts/glibc-needed.py "$f")
    if [ "$("$venv/bin/python" -c "print(tuple(map(int, '$newest'.split('.'))) <= (2, 17))")" != True ]; then
      echo "build-wheel: $(basename "$f") needs glibc $newest, newer than its tag $tag" >&2
      exit 1
    fi
    echo "build-wheel: $(basename "$f") ($arch) needs glibc $newest at most" >&2
  done
  rm -rf "$check"
  auditwheel show "$wheel" >&2
  echo "$wheel"
done
