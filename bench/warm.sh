#!/usr/bin/env bash
# Warm epochs: a dataset the page cache holds, read by granary against the same
# files read as ImageFolder does, and against one CRC-32 pass over the same resident bytes.
#
#   bash bench/warm.sh                    # 20,000 ImageNet-like files (2.26 GB), 3 rounds
#   FILES=30000 REPEAT=5 bash bench/warm.sh
#
# Each round: `granary bench compare --states warm --epochs 3` (each side of each epoch in a
# process of its own, its files checked resident with mincore right before it and read again
# if not; the CRC-32 ceiling measured before each granary epoch, each file mapped for the
# pass and over maps made before), then `granary read --workers 2 --epochs 6` in one process
# (epochs 1-5 find the maps of epoch 0 kept). Then the CRC-32 implementations available for
# this CPU (bench/crc32: GB/s per core by buffer size, from cache and from memory). Report:
# bench/reports/warm/report.md (raw: compare-*.json, read-*.json, crc32.tsv).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-20000}
REPEAT=${REPEAT:-3}
WORK=${WORK:-bench-out/warm}
REPORT=${REPORT:-bench/reports/warm}
. bench/common.sh
tree=$WORK/img-$FILES
[ -d "$tree" ] || "$G" bench gen "$tree" --files "$FILES" --classes 100 --sizes imagenet \
    --content random --seed 7 > /dev/null
[ -d "$tree.granary" ] || "$G" pack "$tree" -o "$tree.granary" > /dev/null
rm -f "$REPORT"/compare-*.json "$REPORT"/read-*.json
for run in $(seq 1 "$REPEAT"); do
    "$G" bench compare --raw "$tree" --packed "$tree.granary" --workers 2 --states warm \
        --epochs 3 --json > "$REPORT/compare-$run.json"
    "$G" read "$tree.granary" --workers 2 --epochs 6 --json > "$REPORT/read-$run.json"
    echo "round $run of $REPEAT done" >&2
done
cargo build -q --release --manifest-path bench/crc32/Cargo.toml
bench/crc32/target/release/granary-crc32-bench > "$REPORT/crc32.tsv"
python3 - "$REPORT" "$FILES" "$REPEAT" <<'PY'
import glob, json, statistics, sys
rep, files, repeat = sys.argv[1], sys.argv[2], sys.argv[3]
rows, ratios, made, kept, one_proc = [], [], [], [], []
for f in sorted(glob.glob(f"{rep}/compare-*.json")):
    c = json.load(open(f))
    for r, g, x in zip(c["raw_epochs"], c["granary_epochs"], c["ratios"]):
        cm, ck = g["ceiling_mb_per_s"], g["ceiling_kept_mb_per_s"]
        ratios.append(x); made.append(g["mb_per_s"] / cm); kept.append(g["mb_per_s"] / ck)
        rows.append(f"| {f.split('-')[-1][:-5]} | {g['epoch']} | {r['samples_per_s']:,.0f} | "
                    f"{g['samples_per_s']:,.0f} | **{x:.2f}×** | {cm:,.0f} / {ck:,.0f} | "
                    f"{g['mb_per_s'] / cm:.2f}× / {g['mb_per_s'] / ck:.2f}× | "
                    f"{min(r['resident'], g['resident']) * 100:.1f} % | "
                    f"{g['peak_rss_bytes'] / 1e6:,.0f} MB ({g.get('kept_map_bytes', 0) / 1e6:,.0f} MB of it kept maps) |")
    k = [g["ceiling_kept_mb_per_s"] for g in c["granary_epochs"]]
    read = json.load(open(f.replace("compare-", "read-")))
    later = [e["mb_per_s"] for e in read[1:]]
    one_proc.append((statistics.median(e["samples_per_s"] for e in read[1:]),
                     min(later) / statistics.median(k), max(later) / statistics.median(k),
                     read[0]["samples_per_s"]))
crc = [l.rstrip("\n").split("\t") for l in open(f"{rep}/crc32.tsv")][1:]
sizes = list(dict.fromkeys(r[1] for r in crc))
impls = list(dict.fromkeys(r[0] for r in crc))
val = {(r[0], r[1], r[2]): r[3] for r in crc}
out = ["# Warm epochs (`bash bench/warm.sh`)", "",
       f"{files} ImageNet-like files (random contents), packed with the defaults; {repeat} rounds. "
       "`granary bench compare --states warm --epochs 3 --workers 2`: each side of each epoch in a "
       "process of its own, its files checked resident (`mincore`) right before it; the ceiling is "
       "one CRC-32 pass with 2 threads over the same resident chunk files, measured before each "
       "granary epoch, each file mapped in the pass / over maps made before.", "",
       "| round | epoch | raw samples/s | granary samples/s | granary / raw | ceiling MB/s (mapped in the pass / kept) | granary / ceiling | resident | granary peak RSS |",
       "|---|---:|---:|---:|---:|---:|---:|---:|---:|"] + rows + ["",
       f"granary / raw: median **{statistics.median(ratios):.2f}×**, range {min(ratios):.2f}–{max(ratios):.2f}× "
       f"(goal ≥ 1.5× in every epoch); granary / ceiling: {statistics.median(made):.2f}× of the pass "
       f"that maps each file ({min(made):.2f}–{max(made):.2f}), {statistics.median(kept):.2f}× of the "
       f"pass over kept maps ({min(kept):.2f}–{max(kept):.2f}).", "",
       "One process, `granary read --workers 2 --epochs 6` (epochs 1–5 find the maps of epoch 0 kept):", "",
       "| round | epoch 0 samples/s | epochs 1–5, median samples/s | epochs 1–5 / ceiling over kept maps |",
       "|---:|---:|---:|---:|"]
for i, (m, lo, hi, e0) in enumerate(one_proc, 1):
    out.append(f"| {i} | {e0:,.0f} | {m:,.0f} | {lo:.2f}–{hi:.2f}× |")
out += ["", "CRC-32 implementations on this CPU, one core, GB/s (`bench/crc32`; best of 3 × 2 GiB):", "",
        "| bytes per call | " + " | ".join(f"{i} from cache | {i} from memory" for i in impls) + " |",
        "|---:|" + "---:|" * (2 * len(impls))]
for s in sizes:
    out.append(f"| {int(s):,} | " + " | ".join(f"{val[(i, s, 'cache')]} | {val[(i, s, 'memory')]}" for i in impls) + " |")
open(f"{rep}/report.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
