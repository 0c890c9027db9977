#!/usr/bin/env python3
"""Renders the headline figures from the JSON `bench/report.sh` keeps.

    python3 bench/report.py REPORT_DIR          # rewrite README's table and measurements.md's section
    python3 bench/report.py --machine FILES REPEAT   # print this machine's description as JSON

The figures go between marker comments (`<!-- headline:begin -->` ... `<!-- headline:end -->`
in README.md, `<!-- measured:begin -->` ... `<!-- measured:end -->` in docs/measurements.md);
everything else in those files is left as it is. The output is a pure function of the JSON, so
a rerun of the benchmarks changes only numbers.
"""

import datetime
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine(files, repeat):
    def first(path, key):
        for line in open(path):
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
        return "unknown"

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    mem_kib = int(first("/proc/meminfo", "MemTotal").split()[0])
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit + ("+changes" if dirty else ""),
        "cpus": os.cpu_count(),
        "cpu": first("/proc/cpuinfo", "model name"),
        "memory_gib": round(mem_kib / 2**20),
        "kernel": platform.release(),
        "files": int(files),
        "repeat": int(repeat),
        "root": os.geteuid() == 0,
    }


def span(xs, fmt):
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"


def states(compare):
    """Per state: the raw and granary epochs and each epoch's ratio of samples/s."""
    out = {}
    for raw, gra in zip(compare["raw_epochs"], compare["granary_epochs"]):
        s = out.setdefault(raw["state"], {"raw": [], "granary": [], "ratio": []})
        s["raw"].append(raw)
        s["granary"].append(gra)
        s["ratio"].append(gra["samples_per_s"] / raw["samples_per_s"])
    return out


def default_read(read):
    side = next(s for s in read["sides"] if s["name"].startswith("granary read (defaults"))
    device = read["sides"][0]
    return side, device


STATE_NAMES = {
    "cold": "a cold epoch (page cache dropped)",
    "warm": "a warm epoch (dataset and tree resident)",
    "limited": "an epoch larger than memory (each side in a memory cgroup of a third of the data)",
}


def headline_rows(m, pack, read, compare):
    rows = []
    rows.append((
        "`granary pack` against `tar -cf - \\| cat > /dev/null`, cold",
        f"{pack['granary_s']:.2f} s",
        f"{pack['tar_s']:.2f} s",
        f"**{pack['speed_ratio']:.2f}×** tar's speed",
    ))
    per = states(compare)
    for state in ("cold", "warm", "limited"):
        if state not in per:
            continue
        s = per[state]
        # The epoch of the median ratio (the lower of two middles), so that its two rates give
        # its ratio; the spread over every epoch beside it.
        m = sorted(range(len(s["ratio"])), key=lambda i: s["ratio"][i])[(len(s["ratio"]) - 1) // 2]
        rows.append((
            f"{STATE_NAMES[state]}, against raw small files read as ImageFolder does",
            f"{s['granary'][m]['samples_per_s']:,.0f} samples/s",
            f"{s['raw'][m]['samples_per_s']:,.0f} samples/s",
            f"**{s['ratio'][m]:.2f}×** (epochs {span(s['ratio'], '{:.2f}')})",
        ))
    side, device = default_read(read)
    rows.append((
        "a cold epoch at the defaults, against a sequential read of the chunk files",
        f"{side['median_mb_per_s']:,.0f} MB/s",
        f"{device['median_mb_per_s']:,.0f} MB/s",
        f"**{side['vs_device']:.2f}×** the device",
    ))
    cold = per.get("cold") or next(iter(per.values()))
    raw0, gra0 = cold["raw"][0], cold["granary"][0]
    rows.append((
        "metadata operations of one epoch (opens, stats, listings)",
        f"{gra0['metadata_ops']:,}",
        f"{raw0['metadata_ops']:,}",
        f"**{raw0['metadata_ops'] / max(gra0['metadata_ops'], 1):,.0f}×** fewer",
    ))
    return rows


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def provenance(m, compare):
    gb = compare["raw_epochs"][0]["bytes"] / 1e9
    return (f"{m['cpus']} cores ({m['cpu']}), {m['memory_gib']} GiB, Linux {m['kernel']}; "
            f"{m['files']:,} ImageNet-like files ({gb:.2f} GB), {m['repeat']} runs per side; "
            f"{m['date']}, commit {m['commit']}")


def readme_section(m, pack, read, compare):
    rows = headline_rows(m, pack, read, compare)
    return "\n".join([
        table(("what", "granary", "the alternative", "ratio"), rows),
        "",
        f"Measured by `bash bench/report.sh` on {provenance(m, compare)} "
        "([all figures](docs/measurements.md)).",
    ])


def measured_section(m, pack, read, compare):
    out = [
        f"Machine and data: {provenance(m, compare)}. JSON: `bench/reports/headline/`.",
        "",
        "### Headline",
        "",
        table(("what", "granary", "the alternative", "ratio"), headline_rows(m, pack, read, compare)),
        "",
        "### Packing",
        "",
        table(("side", "runs (s)", "median (s)", "files/s"), [
            ("tar", ", ".join(f"{x:.2f}" for x in pack["tar_runs_s"]), f"{pack['tar_s']:.2f}",
             f"{pack['tar_files_per_s']:,.0f}"),
            ("granary pack", ", ".join(f"{x:.2f}" for x in pack["granary_runs_s"]),
             f"{pack['granary_s']:.2f}", f"{pack['granary_files_per_s']:,.0f}"),
        ]),
        "",
        f"The packed dataset: {pack['chunks']} chunks, a {pack['snapshot_bytes']:,}-byte snapshot; "
        f"opening it cold {pack['open_cold_ms']:.1f} ms, warm {pack['open_warm_median_us']:.0f} µs; "
        f"a path lookup {pack['lookup_median_ns']:.0f} ns (median, p99 {pack['lookup_p99_ns']:.0f} ns).",
        "",
        "### A cold epoch against the device",
        "",
        f"`granary bench read`, {read['workers']} workers, {read['window_chunks']} chunks per window, "
        f"queue depth {read['queue_depth']}; medians of {m['repeat']} runs, each side cold.",
        "",
        table(("side", "MB/s", "samples/s", "× device", "CPU s per GB"), [
            (s["name"], f"{s['median_mb_per_s']:,.0f}",
             f"{s['samples_per_s']:,.0f}" if s["samples_per_s"] else "",
             f"{s['vs_device']:.2f}", f"{s['cpu_s_per_gb']:.2f}")
            for s in read["sides"]
        ]),
        "",
        "### Raw files against granary, epoch by epoch",
        "",
        f"`granary bench compare`, {compare['workers']} workers per side, each side of each "
        "epoch in a process of its own; every sample checksummed on both sides "
        f"(digests {'match' if compare['digests_match'] else 'DIFFER'}).",
        "",
    ]
    rows = []
    for state, s in states(compare).items():
        for raw, gra, ratio in zip(s["raw"], s["granary"], s["ratio"]):
            rows.append((state, str(raw["epoch"]), f"{raw['samples_per_s']:,.0f}",
                         f"{gra['samples_per_s']:,.0f}", f"{ratio:.2f}×",
                         f"{raw['peak_rss_bytes'] / 2**20:,.0f} / {gra['peak_rss_bytes'] / 2**20:,.0f}"))
    out += [
        table(("state", "epoch", "raw samples/s", "granary samples/s", "ratio",
               "peak RSS raw / granary (MiB)"), rows),
        "",
        "![throughput](../bench/reports/headline/compare/throughput.svg)",
        "![ratio](../bench/reports/headline/compare/ratio.svg)",
    ]
    return "\n".join(out)


def replace_between(path, begin, end, text):
    body = open(path, encoding="utf-8").read()
    i, j = body.find(begin), body.find(end)
    if i < 0 or j < i:
        sys.exit(f"report: {path} lacks the markers {begin} ... {end}")
    new = body[: i + len(begin)] + "\n" + text + "\n" + body[j:]
    if new != body:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(tmp, path)


def main(argv):
    if argv[:1] == ["--machine"]:
        print(json.dumps(machine(argv[1], argv[2]), indent=1))
        return
    if len(argv) != 1:
        sys.exit(__doc__)
    rep = argv[0]
    m, pack, read, compare = (json.load(open(os.path.join(rep, f"{n}.json")))
                              for n in ("machine", "pack", "read", "compare"))
    if not compare["digests_match"]:
        sys.exit("report: the two sides of the comparison delivered different bytes")
    replace_between(os.path.join(ROOT, "README.md"), "<!-- headline:begin -->",
                    "<!-- headline:end -->", readme_section(m, pack, read, compare))
    replace_between(os.path.join(ROOT, "docs", "measurements.md"), "<!-- measured:begin -->",
                    "<!-- measured:end -->", measured_section(m, pack, read, compare))
    print(f"report: README.md and docs/measurements.md rendered from {rep}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
