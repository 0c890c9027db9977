#!/usr/bin/env bash
# Where a training loop waits: the waits' attribution with a slow origin and with a
# slow tier, checked against the loop's own measure, its cost, and the loop's headspace.
#
#   bash bench/waits.sh                      # 2,000 ImageNet-like files (~220 MB), 3 repeats
#   FILES=4000 REPEAT=5 RATE=40 bash bench/waits.sh
#
# Needs root: the dataset (origin) and the local tier each live on a loop-mounted ext4 image
# of their own, and a blkio cgroup (v1 `blkio.throttle.read_bps_device`) limits reads from one
# of the two devices to RATE MB/s while the other runs free:
#   slow origin: the tier empty, every chunk read from origin (and admitted to the tier);
#   slow tier:   the tier holding every chunk, origin untouched;
# page cache dropped before each run. Each case runs through Python as users do:
# `granary.IterableDataset(DS, batch_size=64, waits=True, cache_dir=..., cache_size=...)`
# under `granary.WaitMeter` with a training step of real work (a numpy pass over each sample);
# the loop's own waits (time in next()) are compared with what making the batches cost
# (the reader's attributed waits plus its Python), and the loop is run again over the same
# batches kept in memory (the rate if data were free: the headspace). The cost of timing:
# `granary read --json` warm, timing on and off (GRANARY_WAIT_TIMING=off), alternated.
# Report: bench/reports/waits/report.md with an SVG timeline per case.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-2000}
REPEAT=${REPEAT:-3}
RATE=${RATE:-40}
WORK=${WORK:-bench-out/waits}
REPORT=${REPORT:-bench/reports/waits}
PY=${PY:-${XDG_CACHE_HOME:-$HOME/.cache}/granary/torch2/bin/python}
[ "$(id -u)" = 0 ] || { echo "bench/waits.sh needs root (loop mounts, blkio cgroups)" >&2; exit 1; }
. bench/common.sh
wheel=$(bash scripts/build-wheel.sh)
"$PY" -m pip install -q --force-reinstall --no-deps "$wheel"
cg=/sys/fs/cgroup/blkio/granary-bench-waits
cleanup() {
    if [ -d "$cg" ]; then
        while read -r p; do echo "$p" > /sys/fs/cgroup/blkio/tasks 2>/dev/null || true; done < "$cg/tasks"
        rmdir "$cg" 2>/dev/null || true
    fi
    for m in origin tier; do mountpoint -q "$WORK/$m" && umount "$WORK/$m"; done
}
trap cleanup EXIT
for m in origin tier; do
    mkdir -p "$WORK/$m"
    if ! mountpoint -q "$WORK/$m"; then
        [ -f "$WORK/$m.img" ] || { truncate -s 1G "$WORK/$m.img"; mkfs.ext4 -q "$WORK/$m.img"; }
        mount -o loop "$WORK/$m.img" "$WORK/$m"
    fi
done
dev() { # major:minor of the loop device under mount point $1
    local src; src=$(findmnt -n -o SOURCE "$1")
    printf '%d:%d' "0x$(stat -c %t "$src")" "0x$(stat -c %T "$src")"
}
ds=$WORK/origin/ds
if [ ! -d "$ds" ]; then
    "$G" bench gen "$WORK/src" --files "$FILES" --classes 20 --sizes imagenet --content random > /dev/null
    "$G" pack "$WORK/src" -o "$ds" --chunk-size 8MiB > /dev/null
    rm -rf "$WORK/src"
fi
mkdir -p "$cg"
limit() { # device or "none"
    for d in "$(dev "$WORK/origin")" "$(dev "$WORK/tier")"; do
        echo "$d 0" > "$cg/blkio.throttle.read_bps_device" 2>/dev/null || true
    done
    [ "$1" = none ] || echo "$1 $((RATE * 1000000))" > "$cg/blkio.throttle.read_bps_device"
}
loop() { # case run: the Python loop in the cgroup, one JSON line out
    sh -c 'echo $$ > '"$cg"'/tasks && exec "$@"' sh "$PY" - "$ds" "$WORK/tier/cache" "$1" "$2" "$REPORT" <<'PY'
import json, sys, time
import numpy as np
import granary

ds, tier, case, run, report = sys.argv[1:]
it = granary.IterableDataset(ds, batch_size=64, waits=True, seed=int(run), cache_dir=tier,
                             cache_size=2 << 30)

def step(batch):  # the training step: real work over every sample's bytes
    s = 0
    for d in batch["data"]:
        a = np.asarray(d)
        s += int(a[::64].sum())
    return s

meter = granary.WaitMeter(it)
kept = []
for batch in meter:
    step(batch)
    kept.append(batch)
r = meter.report()
made = {k: sum(b["waits"][k] for b in kept) for k in kept[0]["waits"]}
t = time.perf_counter()
for b in kept:
    step(b)
replay = len(kept) / (time.perf_counter() - t)
print(json.dumps({"case": case, "run": int(run), "report": r, "made": made,
                  "replay_batches_per_s": replay, "batches": meter.batches}))
PY
}
OUT=$REPORT/results.jsonl
: > "$OUT"
for run in $(seq 1 "$REPEAT"); do
    # Slow origin: an empty tier, origin limited.
    rm -rf "$WORK/tier/cache"
    limit "$(dev "$WORK/origin")"; drop
    loop slow-origin "$run" >> "$OUT"
    # Slow tier: the tier (filled by the run above) limited, origin free.
    limit "$(dev "$WORK/tier")"; drop
    loop slow-tier "$run" >> "$OUT"
    # Nothing limited, the tier full.
    limit none; drop
    loop free "$run" >> "$OUT"
done
limit none
# The cost of timing waits: warm epochs through `granary read`, timing on and off, alternated.
COST=$REPORT/cost.tsv
printf 'timing\trun\tsamples_per_s\n' > "$COST"
"$G" read "$ds" > /dev/null
for run in $(seq 1 $((REPEAT * 4 + 1))); do
    for timing in on off; do
        GRANARY_WAIT_TIMING=$timing "$G" read "$ds" --epochs 3 --json | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    print("%s\t%s\t%.0f" % (sys.argv[1], sys.argv[2], r["samples_per_s"]))' "$timing" "$run" >> "$COST"
    done
done
python3 - "$OUT" "$COST" "$REPORT" "$FILES" "$REPEAT" "$RATE" <<'PY'
import collections, json, statistics, sys
out, cost, report, files, repeat, rate = sys.argv[1:]
rows = [json.loads(l) for l in open(out)]
parts = ["tier_s", "peers_s", "origin_s", "check_s", "plan_s", "other_s", "python_s", "handoff_s"]
by = collections.defaultdict(list)
for r in rows:
    by[r["case"]].append(r)

def svg(batches, path, title):
    colors = {"tier_s": "#4c78a8", "peers_s": "#72b7b2", "origin_s": "#e45756", "check_s": "#f58518",
              "plan_s": "#b279a2", "other_s": "#9d755d", "python_s": "#54a24b", "handoff_s": "#bab0ac"}
    w, h, top = 900, 260, 30
    total = sum(b["wait_s"] + b["step_s"] for b in batches) or 1
    peak = max((b["wait_s"] for b in batches), default=0) or 1
    x = 40.0
    els = [f'<text x="40" y="18" font-family="sans-serif" font-size="13">{title}: each batch\'s wait '
           f'(bar height, up to {peak * 1000:.0f} ms) by part, along the epoch\'s time</text>']
    for b in batches:
        bw = (b["wait_s"] + b["step_s"]) / total * (w - 60)
        y = top + h
        for k in parts:
            bh = b[k] / peak * h
            if bh > 0.05:
                els.append(f'<rect x="{x:.2f}" y="{y - bh:.2f}" width="{max(bw, 0.5):.2f}" '
                           f'height="{bh:.2f}" fill="{colors[k]}"/>')
                y -= bh
        x += bw
    lx = 40
    for k in parts:
        els.append(f'<rect x="{lx}" y="{top + h + 12}" width="10" height="10" fill="{colors[k]}"/>'
                   f'<text x="{lx + 14}" y="{top + h + 21}" font-family="sans-serif" font-size="11">{k[:-2]}</text>')
        lx += 95
    open(path, "w").write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{top + h + 30}">'
                          + "".join(els) + "</svg>\n")

md = ["# Where a training loop waits (`bash bench/waits.sh`)", "",
      f"{files} ImageNet-like files in 8 MiB chunks; the dataset (origin) and the local tier on "
      f"loop-mounted ext4 images of their own; a blkio cgroup limits reads from one of the two "
      f"devices to {rate} MB/s; page cache dropped before each run. Each run is a Python "
      f"training loop: `IterableDataset(DS, batch_size=64, waits=True, cache_dir=TIER, "
      f"cache_size=2GiB)` under `granary.WaitMeter`, a step of real work over every sample "
      f"(numpy). Medians of {repeat} runs (raw: `results.jsonl`).", "",
      "| case | loop's wait, s | attributed: origin | tier | check | plan | other | python | hand-off | made the batches (reader waits + python), s | made / waited | batches/s | data-free batches/s (replayed) |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for case in ("slow-origin", "slow-tier", "free"):
    rs = by.get(case, [])
    if not rs:
        continue
    med = lambda f: statistics.median(f(r) for r in rs)
    wait = med(lambda r: r["report"]["wait_s"])
    share = {k: med(lambda r, k=k: r["report"][k] / max(r["report"]["wait_s"], 1e-12)) for k in parts}
    made = med(lambda r: sum(r["made"][k] for k in parts if k in r["made"]))
    md.append(f"| {case} | {wait:.2f} | {share['origin_s']:.0%} | {share['tier_s']:.0%} | "
              f"{share['check_s']:.0%} | {share['plan_s']:.0%} | {share['other_s']:.0%} | "
              f"{share['python_s']:.0%} | {share['handoff_s']:.0%} | {made:.2f} | "
              f"{made / wait if wait else 0:.3f} | {med(lambda r: r['report']['batches_per_s']):.1f} | "
              f"{med(lambda r: r['replay_batches_per_s']):.1f} |")
    svg(rs[0]["batches"], f"{report}/timeline-{case}.svg", case)
md += ["", "The loop's wait is measured by the loop (time in `next()`), the attribution by the "
       "reader: the waits of the reader's consumer (here, the loop itself: no DataLoader "
       "workers) split by what the I/O thread was doing, plus the Python that made each batch. "
       "`made / waited` compares the two (goal: within 5 %).", ""]
for case in ("slow-origin", "slow-tier", "free"):
    if by.get(case):
        md.append(f"![{case}](timeline-{case}.svg)")
c = collections.defaultdict(list)
pairs = collections.defaultdict(dict)
for line in list(open(cost))[1:]:
    t, run, sps = line.rstrip("\n").split("\t")
    c[t].append(float(sps))
    pairs[run].setdefault(t, []).append(float(sps))
on, off = statistics.median(c["on"]), statistics.median(c["off"])
ratios = [statistics.median(p["on"]) / statistics.median(p["off"]) for p in pairs.values()
          if "on" in p and "off" in p]
md += ["", f"Cost of timing the waits (`granary read DS --epochs 3`, warm, timing on and off "
       f"alternated, {len(ratios)} runs of 3 epochs each; raw: `cost.tsv`): {on:,.0f} samples/s "
       f"on, {off:,.0f} off (medians of every epoch, spread {min(c['on']):,.0f}–{max(c['on']):,.0f} "
       f"and {min(c['off']):,.0f}–{max(c['off']):,.0f}); the median of each run's on/off ratio: "
       f"**{statistics.median(ratios):.3f}×** (goal ≥ 0.98×)."]
open(f"{report}/report.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
