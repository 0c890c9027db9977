#!/usr/bin/env bash
# Before and after: the same benchmarks run with two granary binaries, A and B, alternately on
# the same data and storage, so that a change to the code can show it costs nothing (or what it
# costs). For each binary, in this order, A then B for every row:
#   pack        `granary bench pack` (pack vs tar on the tree, caches dropped before each side)
#   import      the writer API: `granary pack --from webdataset` of the same files as tar shards
#               (caches dropped first), seconds
#   read        `granary bench compare` of the raw tree vs the dataset: cold, warm and limited
#               (each side in a memory cgroup of LIMIT, well below the dataset)
#   mount       every file read through `granary mount` of the dataset (4 readers, caches dropped
#               first), and the raw tree read the same way in the same round, seconds; where
#               FUSE is available
#   s3          with an S3 server configured (GRANARY_TEST_S3, from scripts/s3-server.sh): the
#               dataset packed into the bucket, then one epoch read from it, samples/s
#
#   bash bench/ab.sh OLD_BINARY NEW_BINARY
#   FILES=20000 LIMIT=1GB OUT=bench-out/ab bash bench/ab.sh A B
#
# Every step runs REPEAT times (default 3), alternating A and B; prints the median of each
# figure per binary and the ratio B/A. The JSON of every run stays in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 2 ]; then
  echo "usage: bench/ab.sh A_BINARY B_BINARY" >&2
  exit 2
fi
A=$(realpath "$1")
B=$(realpath "$2")
FILES=${FILES:-10000}
LIMIT=${LIMIT:-600MB}
REPEAT=${REPEAT:-3}
OUT=${OUT:-bench-out/ab}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/granary-ab.XXXXXX")
trap 'if mountpoint -q "$WORK/mnt" 2>/dev/null; then "$B" umount "$WORK/mnt"; fi; rm -rf "$WORK"' EXIT

drop() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}
field() { # stem (OUT/STEM-V-R.json), version, python expression over the JSON document `d`:
  # the median over the repeats
  python3 -c "
import glob, json, statistics, sys
vals = [eval(sys.argv[3], {'d': json.load(open(f))}) for f in sorted(glob.glob(sys.argv[1] + '-' + sys.argv[2] + '-*.json'))]
print(statistics.median(vals))" "$OUT/$1" "$2" "$3"
}
row() { # name, stem, expression
  local a b
  a=$(field "$2" A "$3")
  b=$(field "$2" B "$3")
  python3 -c "import sys; a,b=float(sys.argv[2]),float(sys.argv[3]); print(f'{sys.argv[1]:<40} A {a:>12.3f}   B {b:>12.3f}   B/A {b/a if a else float(\"nan\"):.3f}')" "$1" "$a" "$b"
}

echo "== $FILES ImageNet-like files"
"$B" bench gen "$WORK/src" --files "$FILES" --classes 100 >/dev/null
(cd "$WORK/src" && find . -mindepth 1 -maxdepth 1 -type d | sort | split -n r/4 - "$WORK/list-")
for l in "$WORK"/list-*; do
  tar -cf "$WORK/shard-$(basename "$l").tar" -C "$WORK/src" -T "$l"
done

rm -f "$OUT"/*.json
for r in $(seq "$REPEAT"); do
  for v in A B; do
    bin=${!v}
    rm -rf "$WORK/bp-$v"
    "$bin" bench pack "$WORK/src" --out "$WORK/bp-$v" --json >"$OUT/pack-$v-$r.json" 2>/dev/null
    rm -rf "$WORK/bp-$v" "$WORK/imp-$v"
    drop
    t0=$(date +%s.%N)
    "$bin" pack --from webdataset "$WORK"/shard-*.tar -o "$WORK/imp-$v" -q >/dev/null
    t1=$(date +%s.%N)
    python3 -c "print({'seconds': $t1 - $t0})" | tr "'" '"' >"$OUT/import-$v-$r.json"
    rm -rf "$WORK/imp-$v"
  done
done
"$B" pack "$WORK/src" -o "$WORK/ds" -q >/dev/null
for r in $(seq "$REPEAT"); do
  for v in A B; do
    bin=${!v}
    "$bin" bench compare --raw "$WORK/src" --packed "$WORK/ds" --states cold,warm,limited \
      --memory-limit "$LIMIT" --epochs 1 --json >"$OUT/read-$v-$r.json" 2>/dev/null
  done
done
readall() { # every file under $1 with 4 readers; prints {"seconds": ...}
  local t0 t1
  drop
  t0=$(date +%s.%N)
  (cd "$1" && find . -type f -print0 | xargs -0 -P 4 -n 200 cat >/dev/null)
  t1=$(date +%s.%N)
  python3 -c "print({'seconds': $t1 - $t0})" | tr "'" '"'
}
if [ -e /dev/fuse ]; then
  mkdir -p "$WORK/mnt"
  for r in $(seq "$REPEAT"); do
    for v in A B; do
      "${!v}" mount "$WORK/ds" "$WORK/mnt" >/dev/null 2>&1
      readall "$WORK/mnt" >"$OUT/mount-$v-$r.json"
      "${!v}" umount "$WORK/mnt" >/dev/null 2>&1
      readall "$WORK/src" >"$OUT/mountraw-$v-$r.json"
    done
  done
fi
if [ -n "${GRANARY_TEST_S3:-}" ]; then
  for v in A B; do
    XDG_CACHE_HOME="$WORK/cache-$v" "${!v}" pack "$WORK/src" -o "s3://granary/ab-$v-$$" -q >/dev/null
  done
  for r in $(seq "$REPEAT"); do
    for v in A B; do
      XDG_CACHE_HOME="$WORK/cache-$v" "${!v}" read "s3://granary/ab-$v-$$" --json \
        >"$OUT/s3-$v-$r.json" 2>/dev/null
    done
  done
fi

echo "== A: $A"
echo "== B: $B"
row "pack: granary seconds" pack "d['granary_s']"
row "pack: tar seconds (same run)" pack "d['tar_s']"
row "pack: granary/tar time" pack "d['granary_s'] / d['tar_s']"
row "import (writer API): seconds" import "d['seconds']"
for s in cold warm limited; do
  for side in raw granary; do
    row "read $s: $side samples/s" read "[e for e in d['${side}_epochs'] if e['state']=='$s'][0]['samples_per_s']"
  done
  row "read $s: granary/raw" read "[e for e in d['granary_epochs'] if e['state']=='$s'][0]['samples_per_s'] / [e for e in d['raw_epochs'] if e['state']=='$s'][0]['samples_per_s']"
  row "read $s: granary peak RSS MB" read "[e for e in d['granary_epochs'] if e['state']=='$s'][0]['peak_rss_bytes'] / 1e6"
done
if [ -e /dev/fuse ]; then
  row "mount: seconds" mount "d['seconds']"
  row "mount: raw seconds (same round)" mountraw "d['seconds']"
fi
if [ -n "${GRANARY_TEST_S3:-}" ]; then
  row "s3 read: samples/s" s3 "d[0]['samples_per_s']"
fi
