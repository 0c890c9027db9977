#!/usr/bin/env bash
# `granary pack` against tar on a real tree: the Rust toolchain's documentation
# (~52,000 HTML, JS, CSS and font files, 650 MB) unless TREE says otherwise.
#
#   bash bench/pack-tar.sh                 # needs root to drop the page cache
#   TREE=/data/some/tree REPEAT=7 bash bench/pack-tar.sh
#
# 1. `granary bench pack TREE --repeat REPEAT`: `tar -cf - TREE | cat >/dev/null` and `granary
#    pack TREE -o OUT` (default options: zstd where it saves >= 10 %, output fsynced),
#    alternated, the page cache dropped before each run; medians.
# 2. Where pack's time goes: `granary pack --json` cold and warm, with and without
#    compression (3 runs each, medians): scan (its own timer), reading (cold - warm),
#    compressing (auto - none), and the rest (CRC-32, writing, fsync: warm, no compression,
#    less the scan); and the syscalls of one warm run (`strace -c`, when installed).
# Report: bench/reports/pack-tar/report.md (raw: bench.json, phases.tsv, strace.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
TREE=${TREE:-$(rustc --print sysroot)/share/doc/rust/html}
REPEAT=${REPEAT:-5}
WORK=${WORK:-bench-out/pack-tar}
REPORT=${REPORT:-bench/reports/pack-tar}
. bench/common.sh
[ -d "$TREE" ] || { echo "no tree at $TREE (install the rust-docs component, or set TREE)" >&2; exit 1; }
"$G" bench pack "$TREE" -o "$WORK/tree.granary" --repeat "$REPEAT" --json > "$REPORT/bench.json"
printf 'state\tcompress\trun\telapsed_s\tscan_s\tbytes_out\n' > "$REPORT/phases.tsv"
for run in 1 2 3; do
    for state in cold warm; do
        for c in auto none; do
            rm -rf "$WORK/phase.granary"
            if [ "$state" = cold ]; then drop; else cat "$WORK/tree.granary"/* > /dev/null 2>&1 || true; fi
            "$G" pack "$TREE" -o "$WORK/phase.granary" --compress "$c" --json 2>/dev/null |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print("\t".join(map(str, [sys.argv[1], sys.argv[2], sys.argv[3], round(d["elapsed_s"], 3), round(d["scan_s"], 3), d["bytes_out"]])))' "$state" "$c" "$run" >> "$REPORT/phases.tsv"
        done
    done
done
if command -v strace > /dev/null; then
    rm -rf "$WORK/phase.granary"
    strace -f -c -o "$REPORT/strace.txt" "$G" pack "$TREE" -o "$WORK/phase.granary" > /dev/null 2>&1
fi
rm -rf "$WORK/phase.granary"
python3 - "$REPORT" "$TREE" <<'PY'
import json, os, statistics, sys
rep, tree = sys.argv[1], sys.argv[2]
b = json.load(open(f"{rep}/bench.json"))
rows = [l.rstrip("\n").split("\t") for l in open(f"{rep}/phases.tsv")][1:]
med = lambda st, c, k: statistics.median(float(r[k]) for r in rows if r[0] == st and r[1] == c)
ca, cn, wa, wn = (med("cold", "auto", 3), med("cold", "none", 3), med("warm", "auto", 3), med("warm", "none", 3))
scan_c, scan_w = med("cold", "auto", 4), med("warm", "none", 4)
out = ["# `granary pack` against tar (`bash bench/pack-tar.sh`)", "",
       f"Tree: the Rust toolchain's documentation ({b['files']:,} files, {b['bytes'] / 1e6:,.0f} MB), "
       f"page cache dropped before every run ({b['cold']}), {b['repeat']} runs per side alternated.", "",
       "| side | median s | runs s | files/s |", "|---|---:|---|---:|",
       f"| `tar -cf - TREE \\| cat >/dev/null` | {b['tar_s']:.2f} | {' / '.join(f'{x:.2f}' for x in b['tar_runs_s'])} | {b['tar_files_per_s']:,.0f} |",
       f"| `granary pack TREE -o OUT` | {b['granary_s']:.2f} | {' / '.join(f'{x:.2f}' for x in b['granary_runs_s'])} | {b['granary_files_per_s']:,.0f} |",
       "", f"granary / tar: **{b['speed_ratio']:.2f}×** tar's speed (**{b['granary_s'] / b['tar_s']:.2f}×** its time; goal: at least as fast). "
       f"tar writes nothing (its output goes to /dev/null); pack writes and fsyncs its dataset.", "",
       "Where pack's time goes (medians of 3 runs each, `granary pack --json`):", "",
       "| phase | seconds | how measured |", "|---|---:|---|",
       f"| scanning the tree (cold) | {scan_c:.2f} | pack's own timer (`scan_s`) |",
       f"| reading the files from the device | {ca - wa:.2f} | cold − warm, default options |",
       f"| compressing (zstd, where it saves ≥ 10 %) | {wa - wn:.2f} | warm default − warm `--compress none` |",
       f"| CRC-32, encoding, writing, fsync (and scanning, warm: {scan_w:.2f}) | {wn:.2f} | warm `--compress none` |",
       f"| total, cold, default options | {ca:.2f} | |", "",
       f"Cold without compression: {cn:.2f} s (it writes {int(statistics.median(float(r[5]) for r in rows if r[1] == 'none')) / 1e6:,.0f} MB instead of {int(statistics.median(float(r[5]) for r in rows if r[1] == 'auto')) / 1e6:,.0f} MB)."]
if os.path.exists(f"{rep}/strace.txt"):
    out += ["", "Syscalls of one warm run (`strace -f -c`; times are strace's, inflated by tracing):", "", "```"]
    out += [l.rstrip() for l in open(f"{rep}/strace.txt") if l.strip()][:14] + ["```"]
open(f"{rep}/report.md", "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
