#!/usr/bin/env bash
# The Python package's tests, three times: in a venv of Debian's python3 with its CPU torch 1.13
# (system site packages: python3-torch, installed here with apt if missing), in a venv of PyPI's
# torch 2 with torchdata (python/requirements-torch2.txt: ~6 GB with torch's CUDA libraries, so
# it lives outside the clone, under ${XDG_CACHE_HOME:-~/.cache}/granary, and is installed once
# per machine, in about 4 minutes), and in a plain venv without torch, created afresh each run;
# then built from source as README says (`pip install ./python`) in a fresh venv.
# The extension is built once, as the wheel users install (scripts/build-wheel.sh), and each
# venv installs *that wheel* with no Rust toolchain on PATH and pip told to build nothing
# (--only-binary=:all:, --no-index): the run fails if installing it needed a compiler.
# Then the pure-Python reader of the format (format/python) in a venv of its own. Then runs
# examples/train_digits.py and, small, examples/train_jpeg.py; the engines' tests
# (Parquet, Spark, Ray) and Grain's (with CPU JAX), each in a venv of their own.
# Prints one line "python tests: N passed, N failed, N skipped" at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

py=/usr/bin/python3
if ! "$py" -c 'import torch, numpy, sklearn, venv' >/dev/null 2>&1; then
  echo "installing Debian's python3-torch, python3-numpy, python3-sklearn and python3-venv" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-torch python3-numpy python3-sklearn \
    python3-venv python3-pip >/dev/null
fi

# The CLI the fixtures pack datasets with: $GRANARY_BIN when the caller built one (scripts/test.sh
# passes the binary its Rust tests ran), else a debug build.
if [ -z "${GRANARY_BIN:-}" ]; then
  cargo build -q --bin granary
  export GRANARY_BIN="$PWD/target/debug/granary"
fi

# The wheel, and a PATH without cargo or rustc to install it with.
# Built where scripts/test-wheels.sh builds its wheels, outside the clone (a second run rebuilds
# only granary's own crates).
wheel=$(CARGO_TARGET_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/granary/wheel-target" \
  bash scripts/build-wheel.sh)
echo "python tests: installing $wheel (no Rust toolchain on PATH)" >&2
no_rust_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo/bin' -e 'rustup' | paste -sd:)
if env PATH="$no_rust_path" sh -c 'command -v cargo || command -v rustc' >/dev/null; then
  echo "python tests: cannot hide the Rust toolchain from PATH to prove the wheel needs none" >&2
  exit 1
fi
venvs="$PWD/target/py-venvs"
totals=$(mktemp)
trap 'rm -f "$totals"' EXIT
# Runs a pytest command and counts its summary line under NAME.
count_tests() { # name, command...
  local name=$1 out rc
  shift
  out=$(mktemp)
  set +e
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  tail -n 1 "$out" | sed "s/^/$name: /" >> "$totals"
  rm -f "$out"
  [ "$rc" -eq 0 ] || status=1
}
run_suite() { # name, extra venv flags, venv directory, extra requirements file
  local dir="${3:-$venvs/$1}"
  [ -x "$dir/bin/python" ] || "$py" -m venv $2 "$dir"
  if [ -n "${4:-}" ]; then
    "$dir/bin/pip" install -q --disable-pip-version-check -r "$4"
  fi
  "$dir/bin/pip" install -q --disable-pip-version-check pytest
  env PATH="$no_rust_path" "$dir/bin/pip" install -q --disable-pip-version-check \
    --force-reinstall --no-deps --no-index --only-binary=:all: "$wheel"
  # Run from the checkout root so that the installed package, not python/granary, is imported.
  count_tests "$1" "$dir/bin/python" -m pytest -p no:cacheprovider -q -rs python/tests
}
status=0
run_suite torch --system-site-packages
torch2="${XDG_CACHE_HOME:-$HOME/.cache}/granary/torch2"
run_suite torch2 "" "$torch2" python/requirements-torch2.txt
rm -rf "$venvs/plain"  # a fresh venv: nothing in it but the wheel and pytest
run_suite plain ""
# README's build from source, as written (`pip install ./python`), in a fresh venv: pip fetches
# maturin and builds the extension with cargo (into a target directory outside the clone, so a
# second run rebuilds only granary's own crates); then the package's core tests against it.
rm -rf "$venvs/source"
"$py" -m venv "$venvs/source"
"$venvs/source/bin/pip" install -q --disable-pip-version-check pytest
CARGO_TARGET_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/granary/source-target" \
  "$venvs/source/bin/pip" install -q --disable-pip-version-check ./python
count_tests source "$venvs/source/bin/python" -m pytest -p no:cacheprovider -q -rs \
  python/tests/test_granary.py
# The format's second reader (format/python/granary_format.py: pure Python, written from
# SPEC.md alone) against the test vectors, their damaged variants and the golden datasets, in a
# venv of its own with nothing but pytest and zstandard (no wheel: it needs none).
fmtvenv="$venvs/format"
[ -x "$fmtvenv/bin/python" ] || "$py" -m venv "$fmtvenv"
"$fmtvenv/bin/pip" install -q --disable-pip-version-check pytest zstandard
count_tests format "$fmtvenv/bin/python" -m pytest -p no:cacheprovider -q -rs format/python
# The example: a real training loop; fails if chunk-wise or importance sampling trail a global
# shuffle by more than a point of test accuracy.
if "$venvs/torch/bin/python" examples/train_digits.py --seeds 0,1,2; then
  echo "example: 1 passed" >> "$totals"
else
  echo "example: 1 failed" >> "$totals"
  status=1
fi
# The JPEG example, small: real JPEG bytes decoded with PIL in DataLoader workers, a CNN that
# must learn (fails below 40 % test accuracy; chance is 10 %).
if "$torch2/bin/python" examples/train_jpeg.py --variants 1 --epochs 4 --decoder pil \
    --min-accuracy 40; then
  echo "example: 1 passed" >> "$totals"
else
  echo "example: 1 failed" >> "$totals"
  status=1
fi
# The engines granary writes from (Parquet with pyarrow, Spark, Ray; python/granary/parquet.py,
# spark.py, ray.py) in a venv of their own outside the clone (python/requirements-engines.txt,
# ~1.1 GB, ~3 minutes to install once per machine), with Java for Spark. Their tests and the two
# conversion examples run in a network namespace of their own whose only interface is loopback:
# Ray's servers listen on every interface, and in there that is 127.0.0.1 alone (nothing can
# reach them, and they reach nothing, from outside the machine).
if ! command -v java >/dev/null 2>&1; then
  echo "installing Java for Spark (Debian's openjdk-17-jre-headless)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    openjdk-17-jre-headless >/dev/null
fi
# A venv of its own outside the clone (under ${XDG_CACHE_HOME:-~/.cache}/granary/NAME) with a
# requirements file and the wheel, installed as in run_suite; prints its directory.
own_venv() { # name, requirements file
  local dir="${XDG_CACHE_HOME:-$HOME/.cache}/granary/$1"
  [ -x "$dir/bin/python" ] || "$py" -m venv "$dir" >&2
  "$dir/bin/pip" install -q --disable-pip-version-check -r "$2" >&2
  env PATH="$no_rust_path" "$dir/bin/pip" install -q --disable-pip-version-check \
    --force-reinstall --no-deps --no-index --only-binary=:all: "$wheel" >&2
  printf '%s' "$dir"
}
engines=$(own_venv engines python/requirements-engines.txt)
count_tests engines unshare -n sh -c 'ip link set lo up && exec "$@"' sh env \
  GRANARY_REQUIRE_ENGINES=1 RAY_USAGE_STATS_ENABLED=0 "$engines/bin/python" -m pytest \
  -p no:cacheprovider -q -rs python/tests/test_engines.py
for ex in parquet_captions webdataset_shards; do
  if unshare -n sh -c 'ip link set lo up && exec "$@"' sh "$engines/bin/python" "examples/$ex.py"; then
    echo "example: 1 passed" >> "$totals"
  else
    echo "example: 1 failed" >> "$totals"
    status=1
  fi
done
# Grain and CPU JAX (granary.grain.DataSource) in a venv of their own outside the clone
# (python/requirements-grain.txt, ~0.5 GB, under a minute to install once per machine).
grainvenv=$(own_venv grain python/requirements-grain.txt)
count_tests grain env GRANARY_REQUIRE_GRAIN=1 "$grainvenv/bin/python" -m pytest \
  -p no:cacheprovider -q -rs python/tests/test_grain.py
awk '{ for (i = 2; i <= NF; i++) { if ($(i) ~ /^passed/) p += $(i-1); if ($(i) ~ /^failed/) f += $(i-1);
       if ($(i) ~ /^skipped/) s += $(i-1); if ($(i) ~ /^error/) f += $(i-1) } }
     END { printf "python tests: %d passed, %d failed, %d skipped\n", p, f, s }' "$totals"
exit "$status"
