#!/usr/bin/env bash
# Sharded packing benchmark: the same tree packed by one process and by N = 2 and 4 shard
# processes plus `granary merge`, cold (page cache dropped before each), in one run. Reports wall
# time, files/s, peak RSS per process, merge time, and checks that every result verifies and
# holds the same content (layout-independent samples digest) and that an epoch reads it all.
#
#   bash bench/shard.sh                 # generates a 1,000,000-file tree under $WORK first
#   SRC=path/to/tree bash bench/shard.sh
#
# Needs root for dropping the page cache (skipped with a warning otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-bench-out/shard}
REPORT=${REPORT:-bench/reports/shard}
FILES=${FILES:-1000000}
mkdir -p "$WORK" "$REPORT"
cargo build -q --release --bin granary
G=$PWD/target/release/granary
SRC=${SRC:-$WORK/tree}
if [ ! -d "$SRC" ]; then
    "$G" bench gen "$SRC" --files "$FILES" --classes 1000 --sizes tiny
fi
drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; else echo "warning: cannot drop the page cache (not root): runs are warm" >&2; fi
}
now() { date +%s.%N; }
TSV=$WORK/results.tsv
: > "$TSV"
for n in ${COUNTS:-1 2 4}; do
    ds=$WORK/ds$n.granary
    rm -rf "$ds" "$WORK/.ds$n.granary.partial"
    drop
    t0=$(now)
    if [ "$n" = 1 ]; then
        /usr/bin/time -f "%e %M" -o "$WORK/time-$n-0" "$G" pack "$SRC" -o "$ds" -q --json > "$WORK/pack-$n-0.json"
    else
        pids=()
        for ((i = 0; i < n; i++)); do
            /usr/bin/time -f "%e %M" -o "$WORK/time-$n-$i" "$G" pack "$SRC" -o "$ds" --shard "$i/$n" -q --json > "$WORK/pack-$n-$i.json" &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p"; done
    fi
    t1=$(now)
    if [ "$n" != 1 ]; then
        /usr/bin/time -f "%e %M" -o "$WORK/time-merge-$n" "$G" merge "$ds" --json > "$WORK/merge-$n.json"
    fi
    t2=$(now)
    "$G" verify "$ds" --json > "$WORK/verify-$n.json"
    "$G" read "$ds" --workers 2 --json > "$WORK/read-$n.json"
    "$G" plan "$ds" --json > "$WORK/plan-$n.json"
    echo -e "$n\t$t0\t$t1\t$t2" >> "$TSV"
done
python3 - "$WORK" "$REPORT" <<'EOF'
import json, sys, os
work, report = sys.argv[1], sys.argv[2]
rows = [l.split("\t") for l in open(os.path.join(work, "results.tsv")).read().split("\n") if l]
out = []
out.append("| processes | wall (pack + merge) | files/s | per process: wall s, files, files/s, peak RSS MB | merge | merge peak RSS | samples digest | epoch digest = verify digest |")
out.append("|---|---:|---:|---|---:|---:|---|---|")
digests = set()
for n, t0, t1, t2 in rows:
    n = int(n)
    procs = []
    files = 0
    for i in range(n):
        e, rss = open(os.path.join(work, f"time-{n}-{i}")).read().split()
        p = json.load(open(os.path.join(work, f"pack-{n}-{i}.json")))
        files += p["files"]
        procs.append(f"{float(e):.1f} s, {p['files']:,}, {p['files']/float(e):,.0f}/s, {int(rss)/1024:.0f} MB")
    wall = float(t2) - float(t0)
    merge = mrss = "—"
    if n > 1:
        e, rss = open(os.path.join(work, f"time-merge-{n}")).read().split()
        merge, mrss = f"{float(e):.2f} s", f"{int(rss)/1024:.0f} MB"
    v = json.load(open(os.path.join(work, f"verify-{n}.json")))
    r = json.load(open(os.path.join(work, f"read-{n}.json")))
    assert v["clean"], v
    digests.add(v["samples_digest"])
    same = "yes" if r[0]["digest"] == v["digest"] and r[0]["samples"] == v["samples"] else "NO"
    out.append(f"| {n} | {wall:.1f} s | {files/wall:,.0f} | {'<br>'.join(procs)} | {merge} | {mrss} | `{v['samples_digest']}` | {same} |")
plan = []
for n, *_ in rows:
    p = json.load(open(os.path.join(work, f"plan-{n}.json")))
    q, g = p["quality"], p["global_quality"]
    plan.append(f"{n} process(es): " + ", ".join(f"{k} {q[k]:.4f} (global shuffle {g[k]:.4f})" for k in sorted(q)))
text = "\n".join(out)
text += "\n\nAll results hold the same content: " + ("**yes**" if len(digests) == 1 else "**NO**") + f" ({len(digests)} distinct samples digests).\n"
text += "\nShuffle quality of an epoch plan (`granary plan --json`), per process count:\n\n```\n" + "\n".join(plan) + "\n```\n"
open(os.path.join(report, "report.md"), "w").write("# Sharded packing\n\n" + text)
print(text)
EOF
