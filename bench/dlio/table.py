"""The MLPerf Storage table of bench/dlio.sh: per storage and way of reading, the largest number
of simulated accelerators whose median AU over the runs is >= 90 %, from its results.jsonl."""

import argparse
import json
import statistics
from collections import defaultdict

# Seconds of simulated compute per batch of 400 (DLIO's workload files).
COMPUTE = {"resnet50_h100": 0.224, "resnet50_a100": 0.435, "resnet50_v100": 1.3}
ALONE = ("files alone", "granary alone")

ROWS = {
    "resident": "DLIO, plain files already in the page cache (no storage: the CPU's ceiling)",
    "raw": "DLIO, plain files",
    "mount": "DLIO over `granary mount`",
    "tier": "DLIO over `granary mount` with a fresh local tier",
    "granary": "granary's reader in DLIO (plugin)",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("results")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--repeat", type=int, required=True)
    ap.add_argument("--read-threads", type=int, required=True)
    ap.add_argument("--maxn", type=int, required=True)
    a = ap.parse_args()
    runs = defaultdict(list)
    storages, rows = [], []
    with open(a.results) as f:
        for line in f:
            r = json.loads(line)
            runs[(r["storage"], r["row"], r["accelerators"])].append(r)
            if r["storage"] not in storages:
                storages.append(r["storage"])
            if r["row"] not in rows and r["row"] not in ALONE:
                rows.append(r["row"])
    print(f"DLIO workload {a.workload} (PyTorch loader, batches of 400), {a.files} JPEG files of "
          f"{a.bytes / 1e3:.0f} KB on average, one cold epoch per run, {a.read_threads} DLIO "
          f"read threads per accelerator, median of {a.repeat} run(s) per count.\n")
    print("Each cell: the largest number of accelerators at AU >= 90 % (AU, its spread and "
          "samples/s per accelerator there, or at 1 accelerator if none; then the AU at the "
          "next count).\n")
    print("| reading | " + " | ".join(storages) + " |")
    print("|---|" + "---:|" * len(storages))
    for row in rows:
        cells = []
        for storage in storages:
            best, shown, beyond = 0, None, ""
            for n in range(1, a.maxn + 1):
                rs = runs.get((storage, row, n))
                if not rs:
                    break
                au = statistics.median(r["au"] for r in rs)
                rate = statistics.median(r["samples_per_s"] for r in rs)
                spread = f"{min(r['au'] for r in rs):.0f}–{max(r['au'] for r in rs):.0f}"
                if au >= 90:
                    best, shown = n, (au, spread, rate / n)
                    continue
                if shown is None:
                    shown = (au, spread, rate / n)
                else:
                    beyond = f"; at {n}: AU {au:.1f} %, {spread}"
                break
            if shown is None:
                cells.append("not run")
                continue
            au, spread, per = shown
            top = "≥ " if best == a.maxn else ""
            cells.append(f"**{top}{best}** (AU {au:.1f} %, {spread}; {per:.0f}/s each{beyond})")
        print(f"| {ROWS.get(row, row)} | " + " | ".join(cells) + " |")
    alone(runs, storages, a)


def alone(runs, storages, a):
    """The storage alone (`granary bench compare`, cold, no DLIO): samples/s and how many
    accelerators that would feed at AU >= 90 % were DLIO's CPU not the bound."""
    if not any(runs.get((s, row, 0)) for s in storages for row in ALONE):
        return
    compute = COMPUTE.get(a.workload)
    demand = 400 / compute if compute else None
    print(f"\nThe storage alone (`granary bench compare`, cold, {a.read_threads} workers, every "
          f"sample read and CRC-checked, no decode): samples/s, and the accelerators that rate "
          f"feeds at AU >= 90 %" + (f" ({demand:.0f} samples/s each)" if demand else "") + ".\n")
    print("| reading | " + " | ".join(storages) + " |")
    print("|---|" + "---:|" * len(storages))
    for row in ALONE:
        cells = []
        for storage in storages:
            rs = runs.get((storage, row, 0))
            if not rs:
                cells.append("not run")
                continue
            rate = statistics.median(r["samples_per_s"] for r in rs)
            lo = min(r["samples_per_s"] for r in rs)
            hi = max(r["samples_per_s"] for r in rs)
            fed = f"**{int(rate / (0.9 * demand))}** accelerators, " if demand else ""
            cells.append(f"{fed}{rate:,.0f}/s ({lo:,.0f}–{hi:,.0f})")
        print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
