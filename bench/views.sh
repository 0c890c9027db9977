#!/usr/bin/env bash
# Views against datasets: the epoch of a view read cold, by ranges around its
# records or by whole chunks, beside a dataset rewritten from the same files and the full one.
#
#   bash bench/views.sh                       # 4,000 ImageNet-like files (~440 MB), 3 repeats
#   FILES=8000 REPEAT=5 bash bench/views.sh
#
# Views by random ids keep 1, 5, 10, 25, 50 and 75 % of the samples (spread over every chunk,
# as a quality filter's are), and one keeps a tenth of the classes (10 of 100: the packer mixes
# classes, so that view too is spread over every chunk). Every read is cold (page cache
# dropped; root needed, else the runs say they are warm) and goes through `granary read VIEW
# --json`; GRANARY_VIEW_READS=ranges|chunks forces the two ways a view can read, `auto` is the
# default rule (ranges below SPARSE_SHARE of a chunk's record bytes). The class view and its
# rewritten dataset are also read warm (read once just before). Medians of REPEAT runs, sides
# alternated. Report: bench/reports/views/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-4000}
REPEAT=${REPEAT:-3}
WORK=${WORK:-bench-out/views}
REPORT=${REPORT:-bench/reports/views}
. bench/common.sh
src=$WORK/src
ds=$WORK/ds
if [ ! -d "$ds" ]; then
    rm -rf "$src"
    "$G" bench gen "$src" --files "$FILES" --classes 100 --sizes imagenet --content random > /dev/null
    "$G" pack "$src" -o "$ds" > /dev/null
fi
n=$("$G" info "$ds" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["samples"])')
# Views by random ids, and by a tenth of the classes; the class view's files rewritten as a
# dataset of their own.
for pct in 1 5 10 25 50 75; do
    python3 - "$n" "$pct" > "$WORK/ids-$pct.txt" <<'PY'
import random, sys
n, pct = int(sys.argv[1]), int(sys.argv[2])
random.seed(pct)
print("\n".join(str(i) for i in sorted(random.sample(range(n), max(1, n * pct // 100)))))
PY
    "$G" view "$ds" --ids-from "$WORK/ids-$pct.txt" -o "$WORK/v$pct.gview" --force > /dev/null
done
classes=$(ls "$src" | head -10 | paste -sd,)
"$G" view "$ds" --class "$classes" -o "$WORK/class10.gview" --force > /dev/null
if [ ! -d "$WORK/class10-ds" ]; then
    rm -rf "$WORK/class10-src"
    mkdir -p "$WORK/class10-src"
    for c in ${classes//,/ }; do cp -r "$src/$c" "$WORK/class10-src/"; done
    "$G" pack "$WORK/class10-src" -o "$WORK/class10-ds" > /dev/null
fi

OUT=$REPORT/results.tsv
printf 'case\tmode\trun\tsamples\tbytes\tbytes_read\telapsed_s\n' > "$OUT"
one() { # case mode path [warm: read once more, untimed, instead of dropping the cache]
    if [ "${4:-}" = warm ]; then GRANARY_VIEW_READS=$2 "$G" read "$3" > /dev/null; else drop; fi
    GRANARY_VIEW_READS=$2 "$G" read "$3" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
print("\t".join(str(x) for x in [sys.argv[1], sys.argv[2], sys.argv[3], r["samples"], r["bytes"], r["bytes_read"], round(r["elapsed_s"], 3)]))
' "$1" "$2" "$run" | tee -a "$OUT" >&2
}
for run in $(seq 1 "$REPEAT"); do
    for pct in 1 5 10 25 50 75; do
        for mode in ranges chunks auto; do one "ids-$pct%" "$mode" "$WORK/v$pct.gview"; done
    done
    for mode in ranges chunks auto; do one "class-10%" "$mode" "$WORK/class10.gview"; done
    one "rewritten-class-10%" dataset "$WORK/class10-ds"
    one "full" dataset "$ds"
    one "class-10%" warm "$WORK/class10.gview" warm
    one "rewritten-class-10%" warm "$WORK/class10-ds" warm
done
python3 - "$OUT" "$REPORT/report.md" "$FILES" "$REPEAT" <<'PY'
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
by = collections.defaultdict(list)
info = {}
for case, mode, run, samples, b, br, t in rows:
    by[(case, mode)].append(float(t))
    info[(case, mode)] = (int(samples), int(b), int(br))
med = {k: statistics.median(v) for k, v in by.items()}
out = ["# Views: ranges around records or whole chunks (`bash bench/views.sh`)", "",
       f"{sys.argv[3]} ImageNet-like files (100 classes, random contents), one pack with default "
       f"settings; every epoch read cold through `granary read VIEW --json`; medians of "
       f"{sys.argv[4]} runs (raw: `results.tsv`).", "",
       "| view | samples | MB delivered | ranges: MB read, s | whole chunks: MB read, s | auto, s | ranges / chunks |",
       "|---|---:|---:|---:|---:|---:|---:|"]
cases = sorted({c for c, m in by if m == "ranges"}, key=lambda c: (c.startswith("class"), int(c.split("-")[1].rstrip("%"))))
for c in cases:
    s, b, rr = info[(c, "ranges")]
    _, _, rc = info[(c, "chunks")]
    tr, tc, ta = med[(c, "ranges")], med[(c, "chunks")], med[(c, "auto")]
    out.append(f"| {c} | {s} | {b/1e6:.1f} | {rr/1e6:.1f}, {tr:.2f} | {rc/1e6:.1f}, {tc:.2f} | {ta:.2f} | {tr/tc:.2f} |")
out += ["", "| dataset | samples | MB | s |", "|---|---:|---:|---:|"]
for c in ("rewritten-class-10%", "full"):
    s, b, _ = info[(c, "dataset")]
    out.append(f"| {c} | {s} | {b/1e6:.1f} | {med[(c, 'dataset')]:.2f} |")
v, w = med[("class-10%", "auto")], med[("rewritten-class-10%", "dataset")]
vw, ww = med[("class-10%", "warm")], med[("rewritten-class-10%", "warm")]
out += ["", f"The 10 % class view (auto) against the same files rewritten as a dataset, cold: "
        f"{v:.3f} s / {w:.3f} s = **{v / w:.2f}×** (goal ≤ 1.5×); warm (read once before): "
        f"{vw:.3f} s / {ww:.3f} s = **{vw / ww:.2f}×**; against the full dataset, cold: "
        f"{v / med[('full', 'dataset')]:.2f}×."]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
