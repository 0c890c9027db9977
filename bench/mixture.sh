#!/usr/bin/env bash
# Mixtures against one dataset: three datasets of different sizes mixed 0.5 / 0.3 /
# 0.2 against one dataset packed from all their files, the same samples and bytes per epoch.
#
#   bash bench/mixture.sh                     # 6,000 ImageNet-like files (~660 MB), 3 repeats
#   FILES=20000 REPEAT=5 WORKERS=2 MEMORY="128MiB 32MiB" bash bench/mixture.sh
#   CHUNK=8MiB bash bench/mixture.sh           # datasets packed with --chunk-size 8MiB
#
# The three trees hold 50 %, 30 % and 20 % of FILES; with weights 0.5,0.3,0.2 and the default
# epoch size (every sample together) a mixture's epoch delivers each sample once, as the one
# dataset's does. Both are read through `granary read --json` (the mixture: `granary read A B C
# --weights 0.5,0.3,0.2`), cold (page cache dropped; root needed, else the runs say they are
# warm) and warm (read once just before), sides alternated; medians of REPEAT runs and the
# spread of each run's ratio. Each mixture epoch's share of every source is checked against its
# weight. Both sides read with each read-buffer budget of MEMORY (`--memory`, default the
# library's 128 MiB), which a mixture gives each source: a third side reads the one dataset
# with the mixture's whole budget (3 x MEMORY), the comparison at equal memory. Report:
# bench/reports/mixture/report.md (raw: results.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-6000}
REPEAT=${REPEAT:-3}
WORKERS=${WORKERS:-1}
MEMORY=${MEMORY:-128MiB}
CHUNK=${CHUNK:-}
WORK=${WORK:-bench-out/mixture}
REPORT=${REPORT:-bench/reports/mixture}
. bench/common.sh
names=(web books code)
counts=($((FILES * 5 / 10)) $((FILES * 3 / 10)) $((FILES - FILES * 5 / 10 - FILES * 3 / 10)))
sfx=${CHUNK:+-$CHUNK}
packopt=(${CHUNK:+--chunk-size "$CHUNK"})
if [ ! -d "$WORK/src-all" ]; then
    rm -rf "$WORK"/src-* "$WORK"/*.granary
    mkdir -p "$WORK/src-all"
    for k in 0 1 2; do
        n=${names[$k]}
        "$G" bench gen "$WORK/src-$n" --files "${counts[$k]}" --classes 50 --sizes imagenet \
            --content random --seed $((k + 11)) > /dev/null
        # The same files under one root (hard links: no second copy on disk).
        cp -al "$WORK/src-$n" "$WORK/src-all/$n"
    done
fi
for n in web books code all; do
    [ -d "$WORK/$n$sfx.granary" ] || "$G" pack "$WORK/src-$n" -o "$WORK/$n$sfx.granary" "${packopt[@]}" > /dev/null
done
OUT=$REPORT/results.tsv
printf 'side\tstate\tmemory\trun\tsamples\tbytes\telapsed_s\tsamples_per_s\tpeak_rss_mb\tpeak_buffers_mb\tfractions\n' > "$OUT"
one() { # side state memory
    local args
    local mem=$3
    if [ "$1" = mixture ]; then
        args=("$WORK/web$sfx.granary" "$WORK/books$sfx.granary" "$WORK/code$sfx.granary" --weights 0.5,0.3,0.2)
    else
        args=("$WORK/all$sfx.granary")
        # The mixture's whole budget: MEMORY for each of its three sources.
        [ "$1" = one-dataset ] || mem=$((3 * $(numfmt --from=iec-i "${3%B}")))
    fi
    args+=(--workers "$WORKERS" --memory "$mem")
    if [ "$2" = warm ]; then "$G" read "${args[@]}" > /dev/null; else drop; fi
    "$G" read "${args[@]}" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
fr = ",".join("%.5f" % s["fraction"] for s in r.get("sources", []))
rss = (r.get("peak_rss_bytes") or 0) / 1e6
print("\t".join(str(x) for x in [sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], r["samples"],
      r["bytes"], round(r["elapsed_s"], 3), round(r["samples_per_s"]), round(rss),
      round(r["peak_buffer_bytes"] / 1e6), fr or "-"]))
' "$1" "$2" "$3" "$run" | tee -a "$OUT" >&2
}
for run in $(seq 1 "$REPEAT"); do
    for mem in $MEMORY; do
        for state in cold warm; do
            one one-dataset "$state" "$mem"
            one mixture "$state" "$mem"
            one one-dataset-3x "$state" "$mem"
        done
    done
done
python3 - "$OUT" "$REPORT/report.md" "$FILES" "$REPEAT" "$WORKERS" "${CHUNK:-32MiB (the default)}" <<'PY'
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
rate = collections.defaultdict(list)
rss = collections.defaultdict(list)
bufs = collections.defaultdict(list)
worst = 0.0
samples = {}
mems = []
for side, state, mem, run, n, b, t, sps, peak, pb, fr in rows:
    rate[(side, state, mem)].append(float(sps))
    rss[(side, state, mem)].append(float(peak))
    bufs[(side, state, mem)].append(float(pb))
    samples[side] = (int(n), int(b))
    if mem not in mems:
        mems.append(mem)
    if fr != "-":
        got = [float(x) for x in fr.split(",")]
        worst = max(worst, max(abs(g - w) for g, w in zip(got, (0.5, 0.3, 0.2))))
med = lambda d, k: statistics.median(d[k])
def ratios(state, mem, other):
    """Each run's mixture / other rate (runs alternated, so each pair shares its conditions)."""
    r = [m / o for m, o in zip(rate[("mixture", state, mem)], rate[(other, state, mem)])]
    return statistics.median(r), min(r), max(r)
out = ["# Mixtures against one dataset (`bash bench/mixture.sh`)", "",
       f"{sys.argv[3]} ImageNet-like files (random contents) in three datasets of 50 / 30 / 20 % "
       f"(chunks of {sys.argv[6]}), "
       f"mixed 0.5 / 0.3 / 0.2 (`granary read A B C --weights 0.5,0.3,0.2`), against one "
       f"dataset packed from all of them (`granary read ALL`): the same samples and bytes per "
       f"epoch; {sys.argv[5]} worker(s); {sys.argv[4]} runs, sides alternated: medians, and the "
       f"median (min–max) of each run's ratio (raw: `results.tsv`). A mixture reads each source "
       f"with `--memory` (3 × in all); the last column compares it with the one dataset read "
       f"with that whole budget.", "",
       "| --memory | state | one dataset, samples/s | mixture, samples/s | mixture / one | one dataset at 3 × --memory | mixture / that | peak buffers one / mixture, MB | peak RSS one / mixture, MB |",
       "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
for mem in mems:
    for state in ("cold", "warm"):
        a, m = med(rate, ("one-dataset", state, mem)), med(rate, ("mixture", state, mem))
        a3 = med(rate, ("one-dataset-3x", state, mem))
        r, lo, hi = ratios(state, mem, "one-dataset")
        r3, lo3, hi3 = ratios(state, mem, "one-dataset-3x")
        ba, bm = med(bufs, ("one-dataset", state, mem)), med(bufs, ("mixture", state, mem))
        ra, rm = med(rss, ("one-dataset", state, mem)), med(rss, ("mixture", state, mem))
        out.append(f"| {mem} | {state} | {a:,.0f} | {m:,.0f} | **{r:.2f}×** ({lo:.2f}–{hi:.2f}) | "
                   f"{a3:,.0f} | {r3:.2f}× ({lo3:.2f}–{hi3:.2f}) | "
                   f"{ba:.0f} / {bm:.0f} | {ra:.0f} / {rm:.0f} |")
n, b = samples["mixture"]
out += ["", f"Each epoch: {n} samples, {b / 1e6:.0f} MB. Every mixture epoch's share of each "
        f"source within **{worst * 100:.3f} %** of its weight (goal ≤ 1 %)."]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
