#!/usr/bin/env bash
# The main job on a built-in default: generate an ImageNet-like tree, pack it (timed against
# tar on the same tree, caches cold), inspect it, verify it, stream shuffled epochs (timed
# against a direct sequential read of the same chunk files), compare a training loader's reads of
# the raw files and of granary (report with plots in demo-data/report), read every sample back
# and compare with the source byte for byte.
#   FILES=20000 bash scripts/demo.sh      # more files (default 5000, ~550 MB)
#   DEMO_DIR=/scratch/demo bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-5000}
DIR=${DEMO_DIR:-demo-data}

cargo build --release --quiet
G=target/release/granary
mkdir -p "$DIR"
rm -rf "$DIR/src" "$DIR/src.granary" "$DIR/restored" "$DIR/report"

echo "== generating $FILES ImageNet-like files (lognormal sizes, mean ~110 KiB) in $DIR/src"
$G bench gen "$DIR/src" --files "$FILES" --classes 100 --sizes imagenet

echo; echo "== packing: granary vs tar on the same tree, page cache dropped before each run"
$G bench pack "$DIR/src" -o "$DIR/src.granary"

echo; echo "== the dataset"
$G info "$DIR/src.granary"
$G ls "$DIR/src.granary" class_0007/ --long | head -5

echo; echo "== verify every checksum"
$G verify "$DIR/src.granary"

echo; echo "== stream two shuffled epochs (chunk-wise, io_uring) as a training job would"
$G read "$DIR/src.granary" --epochs 2 --workers 2

echo; echo "== epoch throughput vs the device's sequential bandwidth, caches dropped (fio if installed)"
$G bench read "$DIR/src.granary"

echo; echo "== a training loader's view: raw files (ImageFolder-style) vs granary, caches dropped, 2 workers"
$G bench compare --raw "$DIR/src" --packed "$DIR/src.granary" --workers 2 --report "$DIR/report"

echo; echo "== read every sample back and compare with the source"
$G extract "$DIR/src.granary" -o "$DIR/restored"
diff -r "$DIR/src" "$DIR/restored" && echo "restored tree is byte-identical to the source"
first=$($G ls "$DIR/src.granary" | head -1)
cmp <($G cat "$DIR/src.granary" "$first") "$DIR/src/$first" && echo "granary cat $first: identical"
