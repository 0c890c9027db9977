#!/usr/bin/env bash
# Deleting 1 % of a dataset's samples against repacking it: `granary delete` (a new snapshot
# generation, no chunk rewritten), then `granary compact --all --grace 0` (the chunks holding
# deleted records rewritten without them), each beside a full `granary pack` of the same tree,
# and a cold epoch read before the deletion, after it and after the compaction.
#
#   bash bench/delete.sh                      # 1,000,000 files of ~1 KiB (1,000 classes), 3 repeats
#   FILES=20000 REPEAT=3 bash bench/delete.sh # a quick run
#   GRANARY_BIN=path/to/granary bash bench/delete.sh   # that binary, no cargo build
#
# The tree is `granary bench gen --sizes tiny` (lognormal sizes, mean ~1 KiB, random contents,
# seed 7; 1M files take ~4 GB of 4 KiB blocks), kept in WORK and reused by a rerun. Each of
# REPEAT rounds:
#   1. `granary pack TREE -o OUT` cold (page cache dropped) and then warm (the tree just read),
#      the output removed after each (round 1's cold output is kept as the dataset DS);
#   2. `granary delete D --ids-from IDS --json` of 1 % of the samples (random ids, seed 1) on a
#      fresh copy D of DS (chunk files hard-linked, the snapshot copied: delete replaces the
#      snapshot by a rename and compact unlinks the files it replaces, so DS is never touched),
#      page cache dropped;
#   3. `granary compact D --all --grace 0 --json`, page cache dropped.
# Each command runs under /usr/bin/time (wall, peak RSS, and the bytes the process wrote to the
# file system: ru_oublock x 512). Then REPEAT cold epochs (`granary read X --json`, page cache
# dropped) of DS, of the last round's deleted copy and of its compacted copy, alternated.
# Medians of REPEAT runs. Report: bench/reports/delete/report.md (raw: results.tsv, reads.tsv,
# and the JSON of the last round's pack, delete, compact and info).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-1000000}
REPEAT=${REPEAT:-3}
SHARE=${SHARE:-1}          # percent of the samples deleted
WORK=${WORK:-bench-out/delete}
REPORT=${REPORT:-bench/reports/delete}
if [ -n "${GRANARY_BIN:-}" ]; then
    # A binary built before (the tree may not build while it is being edited): common.sh's
    # setup without its build.
    mkdir -p "$WORK" "$REPORT"
    WORK=$(cd "$WORK" && pwd)
    G=$WORK/granary
    [ "$GRANARY_BIN" -ef "$G" ] || cp "$GRANARY_BIN" "$G"
    drop() {
        sync
        if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches
        else echo "warning: cannot drop the page cache (not root): runs are warm" >&2; fi
    }
else
    . bench/common.sh
fi
src=$WORK/src-$FILES
ds=$WORK/ds-$FILES
if [ ! -f "$src.complete" ]; then
    rm -rf "$src"
    echo "delete.sh: generating $FILES files in $src" >&2
    /usr/bin/time -f "%e" -o "$WORK/gen.time" \
        "$G" bench gen "$src" --files "$FILES" --classes 1000 --sizes tiny --content random \
        --seed 7 > /dev/null
    sync
    touch "$src.complete"
fi
python3 - "$FILES" "$SHARE" > "$WORK/ids.txt" <<'PY'
import random, sys
n, pct = int(sys.argv[1]), float(sys.argv[2])
random.seed(1)
print("\n".join(str(i) for i in sorted(random.sample(range(n), max(1, int(n * pct / 100))))))
PY

RES=$WORK/results.tsv
printf 'step\trun\telapsed_s\tmax_rss_kib\tfs_written_bytes\ttool_s\tcpu_s\tloadavg1\n' > "$RES"
timed() { # step run json-out command...: runs it under /usr/bin/time, appends a row
    local step=$1 run=$2 out=$3
    shift 3
    /usr/bin/time -f "%e %M %O %U %S" -o "$WORK/time.txt" "$@" > "$out"
    read -r wall rss blocks user sys < "$WORK/time.txt"
    load=$(cut -d' ' -f1 /proc/loadavg)
    tool=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("elapsed_s", ""))' "$out")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$step" "$run" "$wall" "$rss" "$((blocks * 512))" "$tool" \
        "$(python3 -c "print(round($user + $sys, 2))")" "$load" | tee -a "$RES" >&2
}
copy() { # DS COPY: chunk files hard-linked, everything else copied
    rm -rf "$2"
    mkdir "$2"
    for f in "$1"/*; do
        case $f in *.gchunk) ln "$f" "$2/" ;; *) cp "$f" "$2/" ;; esac
    done
}
rm -rf "$ds"
for run in $(seq 1 "$REPEAT"); do
    out=$WORK/pack.out
    rm -rf "$out"
    drop
    timed pack-cold "$run" "$WORK/pack-cold.json" "$G" pack "$src" -o "$out" -q --json
    if [ ! -d "$ds" ]; then mv "$out" "$ds"; cp "$WORK/pack-cold.json" "$WORK/pack-ds.json"; fi
    rm -rf "$out"
    timed pack-warm "$run" "$WORK/pack-warm.json" "$G" pack "$src" -o "$out" -q --json
    rm -rf "$out"
    copy "$ds" "$WORK/del"
    drop
    timed delete "$run" "$WORK/delete.json" "$G" delete "$WORK/del" --ids-from "$WORK/ids.txt" --json
    copy "$WORK/del" "$WORK/deleted"   # kept for the reads: compact unlinks the files it replaces
    "$G" info "$WORK/deleted" --json > "$WORK/info-deleted.json"
    drop
    timed compact "$run" "$WORK/compact.json" "$G" compact "$WORK/del" --all --grace 0 --json
    rm -rf "$WORK/compacted"
    mv "$WORK/del" "$WORK/compacted"
    echo "delete.sh: round $run of $REPEAT done" >&2
done
"$G" info "$ds" --json > "$WORK/info-ds.json"
"$G" info "$WORK/compacted" --json > "$WORK/info-compacted.json"

READS=$WORK/reads.tsv
printf 'state\trun\tsamples\tbytes\tbytes_read\telapsed_s\tdigest\tcpu_s\tloadavg1\n' > "$READS"
states=(before deleted compacted)
for run in $(seq 1 "$REPEAT"); do
    for k in 0 1 2; do   # the order rotates from run to run
        state=${states[$(( (k + run - 1) % 3 ))]}
        case $state in before) d=$ds ;; *) d=$WORK/$state ;; esac
        drop
        "$G" read "$d" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)[0]
print("\t".join(str(x) for x in [sys.argv[1], sys.argv[2], r["samples"], r["bytes"], r["bytes_read"], r["elapsed_s"], r["digest"], r["cpu_s"], open("/proc/loadavg").read().split()[0]]))
' "$state" "$run" | tee -a "$READS" >&2
    done
done
"$G" verify "$WORK/compacted" --json > "$WORK/verify-compacted.json" || true

# Sizes of the affected chunks (before compaction) and of the files compaction wrote.
python3 - "$WORK" <<'PY' > "$WORK/sizes.json"
import json, os, sys
w = sys.argv[1]
info = json.load(open(f"{w}/info-deleted.json"))
affected = [c["chunk"] for c in info["deleted"]["chunks"]]
size = lambda d, f: os.path.getsize(os.path.join(w, d, f))
files = lambda d: sorted(f for f in os.listdir(os.path.join(w, d)) if f.endswith(".gchunk"))
deleted_files = files("deleted")
print(json.dumps({
    "affected_chunks": len(affected),
    "affected_bytes": sum(size("deleted", f"chunk-{c:08d}.gchunk") for c in affected),
    "chunks": len(deleted_files),
    "chunk_bytes_deleted": sum(size("deleted", f) for f in deleted_files),
    "chunk_bytes_compacted": sum(size("compacted", f) for f in files("compacted")),
}))
PY
mkdir -p "$REPORT"
cp "$RES" "$READS" "$REPORT/"
for f in pack-ds delete compact info-deleted info-compacted verify-compacted sizes; do
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d.pop("classes", None) if isinstance(d, dict) else None; json.dump(d, open(sys.argv[2], "w"), indent=1)' \
        "$WORK/$f.json" "$REPORT/$f.json"
done
python3 bench/report.py --machine "$FILES" "$REPEAT" > "$REPORT/machine.json"
cp "$WORK/gen.time" "$REPORT/gen.time" 2> /dev/null || true
python3 - "$REPORT" "$FILES" "$REPEAT" "$SHARE" "$(du -sk "$src" | cut -f1)" \
    "$(stat -c %s "$ds/snapshot.gsnap")" "${GRANARY_BIN:-}" "$(sha256sum "$G" | cut -c1-12)" <<'PY'
import collections, json, statistics, sys
rep, files, repeat, share = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
tree_kib, snap0 = int(sys.argv[5]), int(sys.argv[6])
binary = (f"binary `{sys.argv[7]}` given by GRANARY_BIN, not built from this commit" if sys.argv[7]
          else "binary built from this checkout") + f" (sha256 {sys.argv[8]}…)"
J = lambda n: json.load(open(f"{rep}/{n}.json"))
m, pk, dl, cp, sz = J("machine"), J("pack-ds"), J("delete"), J("compact"), J("sizes")
vf = J("verify-compacted")
rows = [l.rstrip("\n").split("\t") for l in open(f"{rep}/results.tsv")][1:]
by = collections.defaultdict(list)
loads = []
for step, run, wall, rss, written, tool, cpu, load in rows:
    by[step].append((float(wall), int(rss) * 1024, int(written), float(tool) if tool else None, float(cpu)))
    loads.append(float(load))
med = lambda step, i: statistics.median(r[i] for r in by[step])
runs = lambda step: " / ".join(f"{r[0]:.2f}" for r in by[step])
reads = [l.rstrip("\n").split("\t") for l in open(f"{rep}/reads.tsv")][1:]
rd = collections.defaultdict(list)
info = {}
for state, run, s, b, br, t, dg, cpu, load in reads:
    rd[state].append(float(t))
    loads.append(float(load))
    info[state] = (int(s), int(b), int(br), dg)
rmed = {k: statistics.median(v) for k, v in rd.items()}
pc, pw, de, co = med("pack-cold", 0), med("pack-warm", 0), med("delete", 0), med("compact", 0)
mb = lambda x: f"{x / 1e6:,.1f} MB"
gen = open(f"{rep}/gen.time").read().strip() if __import__("os").path.exists(f"{rep}/gen.time") else "?"
out = [f"# Deleting {share} % of a dataset against repacking it (`bash bench/delete.sh`)", "",
       f"Command: `{'GRANARY_BIN=' + sys.argv[7] + ' ' if sys.argv[7] else ''}FILES={files} REPEAT={repeat} bash bench/delete.sh`. Machine: {m['cpus']} × {m['cpu']}, "
       f"{m['memory_gib']} GiB, kernel {m['kernel']}, one ext4 disk; commit {m['commit']}, {m['date']}; {binary}; "
       f"{'root: page cache dropped before every cold run' if m['root'] else 'NOT root: every run warm'}.", "",
       f"Tree: {files:,} files from `granary bench gen --sizes tiny --classes 1000 --seed 7` "
       f"(lognormal sizes, mean ~1 KiB, random contents; {pk['bytes_in'] / 1e6:,.0f} MB of data in "
       f"{tree_kib * 1024 / 1e9:,.2f} GB of blocks; generated in {gen} s, written straight as files "
       f"— no tar shards needed). Dataset: one `granary pack` with default settings: "
       f"{pk['chunks']} chunks, {mb(pk['bytes_out'])}. Deleted: {dl['deleted']:,} random ids (seed 1), "
       f"{mb(dl['dead_bytes'])} of records in {dl['chunks_affected']} of {sz['chunks']} chunks. "
       f"Each step timed under `/usr/bin/time` (wall, peak RSS, bytes the process wrote to the file "
       f"system = ru_oublock × 512); medians of {repeat} runs (raw: `results.tsv`, `reads.tsv`).", "",
       "| step | wall, median | runs | CPU s (user+sys), median | written (file system) | written (granary's own figure) | peak RSS | time / cold repack |",
       "|---|---:|---|---:|---:|---:|---:|---:|",
       f"| `granary pack TREE -o OUT`, cold (full repack) | {pc:.2f} s | {runs('pack-cold')} | {med('pack-cold', 4):.2f} | {mb(med('pack-cold', 2))} | {mb(pk['bytes_out'])} (`bytes_out`) | {med('pack-cold', 1) / 1e6:,.0f} MB | 1 |",
       f"| `granary pack TREE -o OUT`, warm (tree just read) | {pw:.2f} s | {runs('pack-warm')} | {med('pack-warm', 4):.2f} | {mb(med('pack-warm', 2))} | | {med('pack-warm', 1) / 1e6:,.0f} MB | {pw / pc:.3f} |",
       f"| `granary delete DS --ids-from IDS` ({share} %), cold | {de:.3f} s | {' / '.join(f'{r[0]:.3f}' for r in by['delete'])} | {med('delete', 4):.2f} | {mb(med('delete', 2))} | {mb(dl['snapshot_bytes'])} (`snapshot_bytes`) | {med('delete', 1) / 1e6:,.0f} MB | **{de / pc:.4f}** |",
       f"| `granary compact DS --all --grace 0`, cold | {co:.2f} s | {runs('compact')} | {med('compact', 4):.2f} | {mb(med('compact', 2))} | {mb(cp['bytes_written'])} (`bytes_written`) | {med('compact', 1) / 1e6:,.0f} MB | {co / pc:.3f} |",
       "",
       f"- **delete / repack time: {de / pc * 100:.2f} %** of the cold repack ({de / pw * 100:.2f} % of the warm one; goal ≤ 2 %). "
       f"It writes a snapshot of {mb(dl['snapshot_bytes'])} (the original's is {mb(snap0)}); the file system saw "
       f"{med('delete', 2) / dl['snapshot_bytes']:.2f}× that written.",
       f"- **compact: {cp['bytes_written'] / sz['affected_bytes']:.3f}× the affected chunks' bytes** by its own count "
       f"({mb(cp['bytes_written'])} written, snapshot included, against {mb(sz['affected_bytes'])} in the "
       f"{sz['affected_chunks']} chunks holding deleted records), {med('compact', 2) / sz['affected_bytes']:.3f}× by the "
       f"file system's (goal ≤ 1.1×); it read {mb(cp['bytes_read'])}, rewrote {cp['chunks_rewritten']} chunks, removed "
       f"{cp['records_removed']:,} records ({mb(cp['bytes_removed'])}); chunk files {mb(sz['chunk_bytes_deleted'])} → "
       f"{mb(sz['chunk_bytes_compacted'])}. Time: {co / pc:.2f}× the cold repack, {co / pw:.2f}× the warm one.",
       "",
       f"Cold epochs (`granary read X --json`, page cache dropped, defaults: 1 worker, chunkwise shuffle), medians of {repeat}:",
       "",
       "| dataset | samples | MB delivered | MB read | s, median | runs | samples/s | MB/s delivered | samples/s vs before |",
       "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
base = info["before"][0] / rmed["before"]
for st, name in (("before", "before the deletion (generation 0)"), ("deleted", "after the deletion"), ("compacted", "after the compaction")):
    s, b, br, dg = info[st]
    t = rmed[st]
    out.append(f"| {name} | {s:,} | {b / 1e6:,.1f} | {br / 1e6:,.1f} | {t:.2f} | {' / '.join(f'{x:.2f}' for x in rd[st])} | {s / t:,.0f} | {b / 1e6 / t:,.1f} | **{s / t / base:.3f}×** |")
same = info["deleted"][3] == info["compacted"][3]
out += ["", f"Throughput after/before (samples/s; goal ≥ 0.95×): after the deletion **{info['deleted'][0] / rmed['deleted'] / base:.3f}×**, "
        f"after the compaction **{info['compacted'][0] / rmed['compacted'] / base:.3f}×**. "
        f"Epoch digests after the deletion and after the compaction {'agree' if same else 'DIFFER'} "
        f"({info['deleted'][3]} / {info['compacted'][3]}); `granary verify` of the compacted dataset: "
        f"{'clean' if vf.get('clean') else 'NOT CLEAN: ' + json.dumps(vf)[:300]}.",
        "", f"1-minute load average when each step ended: {min(loads):.1f}–{max(loads):.1f} (median "
        f"{statistics.median(loads):.1f}) on {m['cpus']} CPUs; above {m['cpus']}, other processes shared "
        f"the CPUs with the measured one and its wall times are inflated."]
open(f"{rep}/report.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
