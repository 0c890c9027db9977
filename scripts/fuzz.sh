#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets: one per parser of untrusted bytes) for
# SECONDS each, one after another, and prints a table of executions and findings.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     # SECONDS per target, default 60
#
# Needs a nightly toolchain (libFuzzer's instrumentation): without one it says so and exits 0
# (skipped, not passed), or 1 when the run requires fuzzing (GRANARY_REQUIRE_FUZZ=1, as
# scripts/test.sh sets, or CI=true). cargo-fuzz is installed into ~/.cache/granary/cargo-fuzz if it is not
# on PATH. Targets are built once with AddressSanitizer (set FUZZ_SANITIZER=none for plain
# builds: faster, but no allocation limit). Each run starts from the committed corpus
# fuzz/corpus/<target> (seeded from tests/golden, the format's test vectors in format/testdata,
# and the unit tests' vectors:
# `GRANARY_FUZZ_SEEDS=fuzz/corpus cargo test --lib` writes them) and works in a copy under
# target/fuzz/, so the tree is not changed; FUZZ_MINIMIZE=1 merges what a run found back into
# fuzz/corpus, minimised (cargo fuzz cmin).
#
# Exits 1 if any target crashed (a panic, an out-of-bounds access, an allocation over
# FUZZ_MALLOC_MB, default 2048, or a run over 10 s on one input). FUZZ_RUNS=N stops each target
# after N executions instead (SECONDS then bounds it); the input is kept in
# target/fuzz/artifacts/<target>/ and the message says how to replay it. The report goes to
# target/fuzz/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
if ! [[ $secs =~ ^[0-9]+$ ]] || [ "$secs" -eq 0 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]  (SECONDS per target, a positive integer)" >&2
  exit 2
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  # A CI run (GRANARY_REQUIRE_FUZZ=1, as scripts/test.sh sets, or CI=true) fails rather than
  # passing with nothing fuzzed: a missing toolchain is a broken install step.
  if [ "${GRANARY_REQUIRE_FUZZ:-}" = 1 ] || [ "${CI:-}" = true ]; then
    echo "fuzz: error: no nightly Rust toolchain, and this run requires fuzzing (GRANARY_REQUIRE_FUZZ=1 or CI=true): rustup toolchain install nightly" >&2
    exit 1
  fi
  echo "fuzz: skipped: no nightly Rust toolchain here (cargo-fuzz needs one: rustup toolchain install nightly)" >&2
  exit 0
fi
fuzz_root=${XDG_CACHE_HOME:-$HOME/.cache}/granary/cargo-fuzz
export PATH="$fuzz_root/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz into $fuzz_root" >&2
  cargo install --quiet --locked cargo-fuzz --version 0.13.2 --root "$fuzz_root"
fi

sanitizer=${FUZZ_SANITIZER:-address}
malloc_mb=${FUZZ_MALLOC_MB:-2048}
out=$PWD/target/fuzz
# The instrumented build lives outside the clone (as the venvs and the wheels' builds do), so a
# fresh clone rebuilds only granary's own crates: FUZZ_BUILD_DIR to put it elsewhere.
export CARGO_TARGET_DIR=${FUZZ_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/granary/fuzz-build}-$sanitizer
mapfile -t all < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^granary-fuzz$')
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  if ! printf '%s\n' "${all[@]}" | grep -qx "$t"; then
    echo "fuzz: no target $t (targets: ${all[*]})" >&2
    exit 2
  fi
done

echo "fuzz: building the targets (sanitizer: $sanitizer)" >&2
mkdir -p "$out"
if ! (cd fuzz && cargo +nightly fuzz build -O --sanitizer "$sanitizer") >"$out/build.log" 2>&1; then
  echo "fuzz: building the targets failed:" >&2
  tail -40 "$out/build.log" >&2
  exit 1
fi

report=$out/report.md
{
  echo "| target | seconds | executions | exec/s | corpus files | crashes |"
  echo "|---|---:|---:|---:|---:|---:|"
} >"$report"
failed=()
for t in "${targets[@]}"; do
  work=$out/corpus/$t
  art=$out/artifacts/$t
  # Each run reports its own crashes: inputs an earlier run kept (and reported) are cleared.
  rm -rf "$work" "$art"
  mkdir -p "$work" "$art"
  # The committed corpus, plus the golden dataset's files for the format's own parsers.
  cp -r fuzz/corpus/"$t"/. "$work"/ 2>/dev/null || true
  case $t in
    snapshot|paged_snapshot|legacy_snapshot) for v in tests/golden/*/ format/testdata/*/; do cp "$v"dataset/snapshot.gsnap "$work/golden-$(basename "$v")"; done ;;
    chunk) for v in tests/golden/*/ format/testdata/*/; do for c in "$v"dataset/chunk-*.gchunk; do cp "$c" "$work/$(basename "$v")-$(basename "$c")"; done; done ;;
  esac
  log=$out/$t.log
  set +e
  (cd fuzz && cargo +nightly fuzz run -O --sanitizer "$sanitizer" "$t" "$work" -- \
    -max_total_time="$secs" ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} -timeout=10 -rss_limit_mb=$((malloc_mb + 1024)) \
    -malloc_limit_mb="$malloc_mb" -print_final_stats=1 -artifact_prefix="$art/") >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  files=$(find "$work" -type f | wc -l)
  crashes=$(find "$art" -type f | wc -l)
  took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  echo "| $t | ${took:-$secs} | ${execs:-?} | ${rate:-?} | $files | $crashes |" >>"$report"
  printf 'fuzz: %-14s %10s executions  %7s/s  corpus %5s  crashes %s\n' \
    "$t" "${execs:-?}" "${rate:-?}" "$files" "$crashes" >&2
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ] || [ -z "$execs" ]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc); its log: $log" >&2
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -20 >&2 || tail -20 "$log" >&2
    for a in "$art"/*; do
      [ -e "$a" ] && echo "fuzz: replay with: (cd fuzz && cargo +nightly fuzz run -O --sanitizer $sanitizer $t $a)" >&2
    done
  fi
  if [ "${FUZZ_MINIMIZE:-0}" = 1 ]; then
    mkdir -p fuzz/corpus/"$t"
    (cd fuzz && cargo +nightly fuzz cmin -O --sanitizer "$sanitizer" "$t" "$work" >/dev/null 2>&1)
    rm -rf fuzz/corpus/"$t"
    cp -r "$work" fuzz/corpus/"$t"
  fi
done
cat "$report"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs} s each, no crashes" >&2
