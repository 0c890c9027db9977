#!/usr/bin/env bash
# What listing and stat-ing a dataset through the mount costs, from an empty snapshot cache:
# mounts each URL (or dataset directory) given, runs the commands below one after another and
# prints each one's time, output lines and the snapshot GETs and bytes fetched so far (the
# mount's user.granary.stats), then the mount's peak RSS. The directories are those
# `granary bench gen --files N` makes (class_0000 ...); a dataset with other names needs
# DIRS="a b c d" (four directories: two stat-ed, the third listed, the fourth listed with -l,
# and -l again on the third) and FILE (a path to cat).
#
#   bash bench/mount-listing.sh s3://granary/b10m-v15 s3://granary/b10m
#
# Needs FUSE (run as root, or with fusermount3) and a granary binary (GRANARY, default
# target/release/granary). Object store settings come from the environment (AWS_*).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${GRANARY:-target/release/granary}
[ -x "$bin" ] || { echo "no $bin: run cargo build --release first, or set GRANARY" >&2; exit 1; }
read -r -a dirs <<<"${DIRS:-class_0042 class_0077 class_0043 class_0044}"
file=${FILE:-class_0013/00000013.JPEG}
[ "$#" -gt 0 ] || { echo "usage: bench/mount-listing.sh DATASET..." >&2; exit 2; }

stats() {
  python3 -c 'import json, os, sys
s = json.loads(os.getxattr(sys.argv[1], "user.granary.stats"))
print("snapshot so far: %d GETs %.1f MB" % (s.get("snapshot_gets", 0), s.get("snapshot_bytes", 0) / 1e6))' "$1"
}

# Runs "$@", printing its label, exit code, time, output lines and the snapshot fetched so far.
step() {
  local label=$1 mnt=$2
  shift 2
  local t0 t1 rc lines
  t0=$(date +%s.%N)
  set +e
  lines=$("$@" 2>/dev/null | wc -l)
  rc=${PIPESTATUS[0]}
  set -e
  t1=$(date +%s.%N)
  printf '%-42s rc=%d %6.2f s (%d lines); %s\n' "$label" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
    "$lines" "$(stats "$mnt")"
}

for ds in "$@"; do
  work=$(mktemp -d)
  mnt=$work/mnt
  mkdir -p "$mnt"
  echo "== $ds"
  export GRANARY_SNAPSHOT_CACHE=$work/cache
  t0=$(date +%s.%N)
  "$bin" mount "$ds" "$mnt" --log "$work/mount.log" >/dev/null
  t1=$(date +%s.%N)
  printf '%-42s rc=0 %6.2f s; %s\n' "granary mount DATASET MNT" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$(stats "$mnt")"
  pid=$(python3 -c 'import os, sys; print(os.getxattr(sys.argv[1], "user.granary.pid").decode())' "$mnt")
  step "stat MNT/${dirs[0]}" "$mnt" stat "$mnt/${dirs[0]}"
  step "stat MNT/${dirs[1]}" "$mnt" stat "$mnt/${dirs[1]}"
  step "cat MNT/$file" "$mnt" cat "$mnt/$file"
  step "ls MNT" "$mnt" ls "$mnt"
  step "ls MNT/${dirs[0]}" "$mnt" ls "$mnt/${dirs[0]}"
  step "ls -l MNT/${dirs[2]}" "$mnt" ls -l "$mnt/${dirs[2]}"
  step "ls -l MNT/${dirs[3]}" "$mnt" ls -l "$mnt/${dirs[3]}"
  step "du -s MNT/${dirs[0]} (listed before)" "$mnt" du -s "$mnt/${dirs[0]}"
  echo "mount peak RSS: $(grep VmHWM "/proc/$pid/status" | awk '{print $2, $3}')"
  "$bin" umount "$mnt"
  rm -rf "$work"
done
