#!/usr/bin/env bash
# Packer memory at scale: trees of 1 M and 10 M files packed by one `granary pack` each, cold
# (page cache dropped before each). Reports wall time, files/s, scan time, peak RSS, and the
# slope between the sizes: the bytes each added file costs (the goal is at most 100).
#
#   bash bench/pack-memory.sh
#   COUNTS="1000000 10000000" SIZE=48 WORK=bench-out/pack-memory bash bench/pack-memory.sh
#
# The files are SIZE bytes (48 by default): 10 M files of ~1 KiB would take 40 GB of 4 KiB
# blocks, and the packer's memory depends on the number of files and their path length (24
# bytes here, like `granary bench gen` names them), not on their size. As root, the trees live
# in a loop-mounted ext4 image with inline data (a 48-byte file then needs no data block), which
# is unmounted and removed at the end; otherwise under $WORK. The datasets go to $WORK and are
# verified, then removed (KEEP=1 keeps trees and datasets).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-bench-out/pack-memory}
REPORT=${REPORT:-bench/reports/pack-memory}
COUNTS=${COUNTS:-1000000 10000000}
SIZE=${SIZE:-48}
. bench/common.sh

TREES=$WORK/trees
MOUNTED=
cleanup() {
    if [ -n "$MOUNTED" ] && [ "${KEEP:-0}" != 1 ]; then
        umount "$TREES" && rm -f "$WORK/trees.img"
    fi
}
trap cleanup EXIT
total=0
for n in $COUNTS; do total=$((total + n)); done
mkdir -p "$TREES"
if [ "$(id -u)" = 0 ] && command -v mkfs.ext4 > /dev/null && ! mountpoint -q "$TREES"; then
    # 256-byte inodes hold up to 60 bytes of data inline; room for every tree's inodes plus
    # their directories.
    rm -f "$WORK/trees.img"
    truncate -s $(( (total * 400 / 1048576 + 1024) ))M "$WORK/trees.img"
    mkfs.ext4 -q -F -O inline_data -I 256 -N $((total + total / 10 + 10000)) \
        -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/trees.img"
    mount -o loop "$WORK/trees.img" "$TREES"
    MOUNTED=1
fi

TSV=$WORK/results.tsv
: > "$TSV"
for n in $COUNTS; do
    tree=$TREES/tree-$n
    if [ ! -d "$tree" ]; then
        echo "generating $n files of $SIZE bytes in $tree" >&2
        "$G" bench gen "$tree" --files "$n" --classes 1000 --sizes "$SIZE" > /dev/null
    fi
    ds=$WORK/ds-$n.granary
    rm -rf "$ds" "$WORK/.ds-$n.granary.partial"
    drop
    echo "packing $n files" >&2
    /usr/bin/time -f "%e %M" -o "$WORK/time-$n" "$G" pack "$tree" -o "$ds" -q --json > "$WORK/pack-$n.json"
    "$G" verify "$ds" --json > "$WORK/verify-$n.json"
    read -r wall rss < "$WORK/time-$n"
    printf '%s\t%s\t%s\n' "$n" "$wall" "$rss" >> "$TSV"
    if [ "${KEEP:-0}" != 1 ]; then rm -rf "$ds"; fi
done

python3 - "$WORK" "$REPORT/report.md" "$SIZE" <<'EOF'
import json, os, sys
work, out, size = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [l.split("\t") for l in open(os.path.join(work, "results.tsv")).read().splitlines()]
lines = [
    f"# Packer memory at scale (`bash bench/pack-memory.sh`)",
    "",
    f"One `granary pack` per tree ({size}-byte files, 1,000 class directories, paths of 24 bytes), "
    "cold page cache, default settings (32 MiB chunks of at most 65,536 files, random order). Peak RSS from `/usr/bin/time`.",
    "",
    "| files | wall | files/s | scan | peak RSS | RSS per file | verify |",
    "|---:|---:|---:|---:|---:|---:|---|",
]
prev = None
for n, wall, rss in rows:
    n, wall, rss = int(n), float(wall), int(rss) * 1024
    p = json.load(open(os.path.join(work, f"pack-{n}.json")))
    v = json.load(open(os.path.join(work, f"verify-{n}.json")))
    ok = "clean" if v["clean"] and v["samples"] == n == p["files"] else f"FAILED: {v}"
    lines.append(
        f"| {n:,} | {wall:.1f} s | {n / wall:,.0f} | {p['scan_s']:.1f} s | {rss / 1e6:.0f} MB "
        f"| {rss / n:.0f} B | {ok} |"
    )
    if prev:
        slope = (rss - prev[1]) / (n - prev[0])
        lines.append(f"| slope {prev[0]:,} → {n:,} | | | | | **{slope:.0f} B/file** | |")
    prev = (n, rss)
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
