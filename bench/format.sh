#!/usr/bin/env bash
# Format 2.0 against a format 1.6 binary, side by side in one run on this machine:
# snapshot bytes per sample, pack time and peak RSS per file, local lookups, shard + merge, and
# what the first commands on a remote dataset fetch.
#
#   A=target/ab-a/release/granary B=target/release/granary bash bench/format.sh
#   FILES=1000000 BIG=10000000 REPEAT=2 ... bash bench/format.sh
#
# A and B are two `granary` binaries built with the same flags (A: format 1.6, B: this tree).
# The tree is FILES files of 48 bytes in 1,000 class directories (as bench/pack-memory.sh makes
# it: in a loop-mounted ext4 image with inline data when run as root). Each side packs it
# REPEAT times, sides alternated, caches dropped before each pack; medians are reported. BIG
# samples of 64 bytes are written straight into a dataset (`bench gen --packed`) for the bytes
# per sample at that size. With an S3 server (scripts/s3-server.sh, its env sourced), a
# FILES-sample dataset per side is written to it and `info`, `plan --world-size 64`, `ls DIR`
# and `cat PATH` each run from an empty snapshot cache, whose allocated bytes afterwards are what
# the command fetched; `bench remote` measures opening, lookups and listings at BIG samples.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${A:?A=path of the granary binary before}" "${B:?B=path of the granary binary after}"
WORK=${WORK:-bench-out/format}
REPORT=${REPORT:-bench/reports/format}
FILES=${FILES:-1000000}
BIG=${BIG:-10000000}
REPEAT=${REPEAT:-2}
# Which parts to run (all by default); results of each part go to their own file.
PARTS=${PARTS:-pack big s3}
mkdir -p "$WORK" "$REPORT"
WORK=$(cd "$WORK" && pwd)
cp "$A" "$WORK/granary-a"
cp "$B" "$WORK/granary-b"
A=$WORK/granary-a
B=$WORK/granary-b
OUT=
rec() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" | tee -a "$OUT" >&2; }
drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
}

TREES=$WORK/trees
MOUNTED=
cleanup() {
    if [ -n "$MOUNTED" ]; then umount "$TREES" && rm -f "$WORK/trees.img"; fi
}
trap cleanup EXIT
mkdir -p "$TREES"
if [ "$(id -u)" = 0 ] && command -v mkfs.ext4 > /dev/null && ! mountpoint -q "$TREES"; then
    rm -f "$WORK/trees.img"
    truncate -s $(( FILES * 400 / 1048576 + 1024 ))M "$WORK/trees.img"
    mkfs.ext4 -q -F -O inline_data -I 256 -N $((FILES + FILES / 10 + 10000)) \
        -E lazy_itable_init=0,lazy_journal_init=0 "$WORK/trees.img"
    mount -o loop "$WORK/trees.img" "$TREES"
    MOUNTED=1
fi
part() {
    case " $PARTS " in *" $1 "*) ;; *) return 1 ;; esac
    OUT=$REPORT/results-$1.tsv
    printf 'side\tmeasure\tvalue\n' > "$OUT"
}
tree=$TREES/tree
if part pack && [ ! -d "$tree" ]; then
    "$B" bench gen "$tree" --files "$FILES" --classes 1000 --sizes 48 --content random > /dev/null
fi

# Peak RSS (KB) and wall seconds of a command, from /usr/bin/time.
timed() {
    local log=$WORK/time.log
    /usr/bin/time -v -o "$log" "$@" > /dev/null
    rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log" | awk -F: '{ if (NF == 3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
}
size_of() { stat -c %s "$1/snapshot.gsnap"; }

part pack && for r in $(seq 1 "$REPEAT"); do
    for side in a b; do
        bin=$WORK/granary-$side
        ds=$WORK/ds-$side
        rm -rf "$ds" "$ds-plain" "$ds-shards"
        drop
        timed "$bin" pack "$tree" -o "$ds" --force
        rec "$side" "pack_s" "$wall"
        rec "$side" "pack_rss_bytes_per_file" "$(( rss * 1024 / FILES ))"
        rec "$side" "snapshot_bytes_per_sample_attrs" "$(awk -v s="$(size_of "$ds")" -v n="$FILES" 'BEGIN{printf "%.1f", s/n}')"
        "$bin" pack "$tree" -o "$ds-plain" --no-metadata --force > /dev/null
        rec "$side" "snapshot_bytes_per_sample_plain" "$(awk -v s="$(size_of "$ds-plain")" -v n="$FILES" 'BEGIN{printf "%.1f", s/n}')"
        for i in 0 1 2 3; do "$bin" pack "$tree" -o "$ds-shards" --shard "$i/4" > /dev/null; done
        timed "$bin" merge "$ds-shards"
        rec "$side" "merge_s" "$wall"
        rec "$side" "merge_rss_mb" "$(( rss / 1024 ))"
        # Local lookups: bench pack packs again beside tar and times 100,000 random lookups.
        drop
        j=$("$bin" bench pack "$tree" -o "$WORK/bp-$side" --json)
        rec "$side" "lookup_median_ns" "$(echo "$j" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["lookup_median_ns"]))')"
        rec "$side" "pack_vs_tar" "$(echo "$j" | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["speed_ratio"], 3))')"
        rm -rf "$WORK/bp-$side" "$ds-shards"
    done
done

part big && for side in a b; do
    bin=$WORK/granary-$side
    big=$WORK/big-$side
    rm -rf "$big" "$WORK/.big-$side.spill" "$WORK/.big-$side.partial"
    timed "$bin" bench gen "$big" --packed --files "$BIG" --sizes 64
    rec "$side" "big_gen_s" "$wall"
    rec "$side" "big_snapshot_bytes_per_sample" "$(awk -v s="$(size_of "$big")" -v n="$BIG" 'BEGIN{printf "%.1f", s/n}')"
    rm -rf "$big"
done

if [ -n "${AWS_ENDPOINT_URL:-}" ] && part s3; then
    for side in a b; do
        bin=$WORK/granary-$side
        url=s3://granary/format-$side-$FILES
        "$bin" bench gen "$url" --packed --files "$FILES" --sizes 64 > /dev/null
        path=$("$bin" ls "$url" class_0007/ | head -1)
        remote() {
            local name=$1
            shift
            local cache=$WORK/cache-$side t0 t1
            rm -rf "$cache"
            t0=$(date +%s.%N)
            GRANARY_SNAPSHOT_CACHE=$cache GRANARY_SNAPSHOT_WHOLE_MAX=0 "$bin" "$@" > /dev/null
            t1=$(date +%s.%N)
            rec "$side" "remote_${name}_s" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')"
            rec "$side" "remote_${name}_cache_kb" "$(du -sk "$cache" | cut -f1)"
        }
        remote info info "$url"
        remote plan plan "$url" --world-size 64
        remote ls ls "$url" class_0007/
        remote cat cat "$url" "$path"
        bigurl=s3://granary/format-$side-$BIG
        "$bin" bench gen "$bigurl" --packed --files "$BIG" --sizes 64 > /dev/null
        GRANARY_SNAPSHOT_WHOLE_MAX=0 "$bin" bench remote "$bigurl" --lookups 20 --lists 2 --world-size 64 --json > "$REPORT/remote-$side.json"
    done
fi
echo "results in $REPORT/results-*.tsv" >&2
