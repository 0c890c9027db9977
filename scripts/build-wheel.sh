#!/usr/bin/env bash
# Builds granary's Python wheel into target/wheel and prints its path: maturin (installed
# once into a build venv of its own, target/py-build) compiles the extension in release mode
# against the stable ABI (abi3), so the one wheel serves every CPython >= 3.9 on this
# platform. The wheel then installs with `pip install target/wheel/granary-*.whl` on a
# machine without a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
venv=target/py-build
if ! [ -x "$venv/bin/maturin" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2"
fi
mkdir -p target/wheel
rm -f target/wheel/granary-*.whl
"$venv/bin/maturin" build --release --strip -m python/Cargo.toml --out target/wheel >&2
ls target/wheel/granary-*.whl
