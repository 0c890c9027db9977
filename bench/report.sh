#!/usr/bin/env bash
# Measures the headline figures and writes them where they are shown: README's "Where it
# stands" table and docs/measurements.md's generated section, both rendered from the JSON the
# benchmarks print (bench/reports/headline/*.json, with the machine and the date in
# machine.json). Nothing in those two places is typed by hand.
#
#   bash bench/report.sh                       # 10,000 ImageNet-like files (~1.1 GB), 3 runs
#   FILES=20000 REPEAT=5 bash bench/report.sh  # larger, more runs
#   RENDER_ONLY=1 bash bench/report.sh         # re-render README and docs from the JSON kept
#
# What runs (release build, page cache dropped before every cold run; as root, the larger-than-
# memory state runs each side in a memory cgroup of a third of the dataset):
#   - granary bench pack     granary pack against tar on the same tree, alternated, medians
#   - granary bench read     a cold epoch against a direct sequential read of the chunk files
#   - granary bench compare  raw small-file reads (ImageFolder's way) against granary: cold,
#                            warm and larger than memory, REPEAT epochs each, SVG plots
# About 6 minutes on 2 cores at the default size. The tree and the dataset are kept in WORK
# (bench-out/report) and reused by a rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-10000}
REPEAT=${REPEAT:-3}
WORK=${WORK:-bench-out/report}
REPORT=${REPORT:-bench/reports/headline}
if [ "${RENDER_ONLY:-0}" = 1 ]; then
    exec python3 bench/report.py "$REPORT"
fi
. bench/common.sh
# Relative to the checkout: the paths land in the JSON kept in the repository.
tree=${WORK#"$PWD"/}/img-$FILES
if [ ! -d "$tree.granary" ]; then
    rm -rf "$tree" "$tree.granary"
    "$G" bench gen "$tree" --files "$FILES" --classes 100 --sizes imagenet --content random \
        --seed 7 > /dev/null
    "$G" pack "$tree" -o "$tree.granary" > /dev/null
fi
states=cold,warm
limit=()
if [ "$(id -u)" = 0 ]; then
    bytes=$(du -sb "$tree" | cut -f1)
    states=cold,warm,limited
    limit=(--memory-limit "$((bytes / 3))")
fi
tmp=$(mktemp -d "$WORK/run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 bench/report.py --machine "$FILES" "$REPEAT" > "$tmp/machine.json"
echo "report: pack (granary pack vs tar, $REPEAT runs each)" >&2
"$G" bench pack "$tree" -o "$tmp/pack.granary" --repeat "$REPEAT" --json > "$tmp/pack.json"
rm -rf "$tmp/pack.granary"
echo "report: read (a cold epoch vs the device, $REPEAT runs each)" >&2
"$G" bench read "$tree.granary" --workers 2 --repeat "$REPEAT" --json > "$tmp/read.json"
echo "report: compare (raw files vs granary: $states)" >&2
rm -rf "$tmp/compare"
"$G" bench compare --raw "$tree" --packed "$tree.granary" --workers 2 --epochs "$REPEAT" \
    --states "$states" "${limit[@]}" --report "$tmp/compare" --json > "$tmp/compare.json"
# Only a complete run replaces the kept one.
mkdir -p "$REPORT"
rm -rf "$REPORT/compare"
mv "$tmp"/*.json "$tmp/compare" "$REPORT"/
python3 bench/report.py "$REPORT"
