"""Writers side by side: the same samples held in memory, written by granary.Writer and by the
writers of WebDataset (ShardWriter), MosaicML Streaming (MDSWriter) and LitData (optimize); and
`granary pack` of the same files from disk (the CLI's own rate, the goal the writer must reach).

Every writer runs in a process of its own. The process first reads the tree's files into memory
(a list of (key, bytes, label), not timed), then writes them all to a fresh output directory on
the same disk as each peer's documentation shows, and syncs the output to disk inside the clock
(every writer pays for its bytes reaching the disk). Peak memory is the process's high-water
mark (VmHWM) and its children's, minus what it held after loading the samples (the samples
themselves are not the writer's memory). Samples are ~110 KB "JPEG" payloads
(`granary bench gen`), stored uncompressed by every writer (granary's auto compression sees
JPEG magic and stores raw).

  python bench/python/writers.py --src TREE --work DIR [--only granary,mds,...] [--repeat N]
      [--json OUT]

Peers need their packages (bench/python/requirements-peers.txt, in the torch 2 venv); a writer
whose package is missing is listed as such and skipped.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def list_tree(src):
    files = sorted(p for p in Path(src).rglob("*") if p.is_file())
    classes = sorted({p.parent.relative_to(src).as_posix() for p in files})
    index = {c: i for i, c in enumerate(classes)}
    return [(p.relative_to(src).as_posix(), p, index[p.parent.relative_to(src).as_posix()])
            for p in files], classes


def sync_tree(out):
    for p in Path(out).rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_granary(samples, classes, out):
    import granary

    with granary.Writer(out, classes=classes, progress=False) as w:
        for key, data, label in samples:
            w.write(key, data, label=label)


def write_webdataset(samples, classes, out):
    import webdataset as wds

    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=256 << 20, verbose=0) as w:
        for key, data, label in samples:
            w.write({"__key__": key.replace(".", "_"), "jpg": data, "cls": str(label).encode()})


def write_mds(samples, classes, out):
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"data": "bytes", "label": "int"},
                   size_limit=64 << 20) as w:
        for key, data, label in samples:
            w.write({"data": data, "label": label})


def _lit_item(i):
    key, data, label = _LIT_SAMPLES[i]
    return {"data": data, "label": label}


_LIT_SAMPLES = None


def write_litdata(samples, classes, out):
    import litdata

    global _LIT_SAMPLES
    _LIT_SAMPLES = samples
    # Indexes as inputs; the samples are inherited by the forked worker (one, as the writer
    # benchmark is one process per writer).
    litdata.optimize(fn=_lit_item, inputs=list(range(len(samples))), output_dir=str(out),
                     chunk_bytes="64MB", num_workers=1, start_method="fork")


def write_granary_expected(samples, classes, out):
    """granary.Writer told how many samples come: straight into chunks, no spill logs."""
    import granary

    with granary.Writer(out, classes=classes, progress=False, expected=len(samples)) as w:
        for key, data, label in samples:
            w.write(key, data, label=label)


def write_granary_lowmem(samples, classes, out):
    """granary.Writer holding at most 256 MiB of samples (the rest spilled to its logs)."""
    import granary

    with granary.Writer(out, classes=classes, progress=False, memory=256 << 20) as w:
        for key, data, label in samples:
            w.write(key, data, label=label)


def write_granary_parquet(samples, classes, out):
    """granary.from_parquet of the same samples as a Parquet file (written before the clock)."""
    import granary

    granary.from_parquet(_PARQUET, out, key="key", data="data", label="label", progress=False)


_PARQUET = None


WRITERS = {
    "granary": (write_granary, "granary"),
    "granary-expected": (write_granary_expected, "granary"),
    "granary-256MiB": (write_granary_lowmem, "granary"),
    "granary-parquet": (write_granary_parquet, "pyarrow"),
    "webdataset": (write_webdataset, "webdataset"),
    "mds": (write_mds, "streaming"),
    "litdata": (write_litdata, "litdata"),
}


def hwm_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def rss_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def run_child(a):
    import importlib
    import resource

    write, module = WRITERS[a.child]
    importlib.import_module(module)
    files, classes = list_tree(a.src)
    samples = [(key, p.read_bytes(), label) for key, p, label in files]
    nbytes = sum(len(d) for _, d, _ in samples)
    if a.child == "granary-parquet":
        global _PARQUET
        import pyarrow as pa
        import pyarrow.parquet as pq

        _PARQUET = str(Path(a.work) / "samples.parquet")
        pq.write_table(pa.table({"key": [k for k, _, _ in samples],
                                 "data": pa.array([d for _, d, _ in samples], pa.binary()),
                                 "label": [classes[lab] for _, _, lab in samples]}),
                       _PARQUET, row_group_size=512)
        samples = samples[:0]  # the Parquet file is the input: nothing held in memory
    base = rss_kb()
    out = Path(a.work) / a.child
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    write(samples, classes, out)
    sync_tree(out)
    dt = time.perf_counter() - t
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    n = len(files)
    print(json.dumps({"samples": n, "bytes": nbytes, "seconds": dt,
                      "samples_per_s": n / dt, "mb_per_s": nbytes / 1e6 / dt,
                      "peak_rss_mb": hwm_kb() / 1024, "after_load_mb": base / 1024,
                      "peak_over_samples_mb": (hwm_kb() - base) / 1024,
                      "children_peak_rss_mb": kids / 1024}))


def cli_pack(a):
    """`granary pack` of the tree (warm: the files were just read by the writers)."""
    cli = os.environ.get("GRANARY_BIN") or shutil.which("granary")
    if not cli:
        return None
    out = Path(a.work) / "cli-pack"
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", cli, "pack", a.src, "-o", str(out)],
                       capture_output=True, text=True, check=True)
    dt = time.perf_counter() - t
    files, _ = list_tree(a.src)
    nbytes = sum(p_.stat().st_size for _, p_, _ in files)
    peak = int(p.stderr.strip().splitlines()[-1]) / 1024
    return {"samples": len(files), "bytes": nbytes, "seconds": dt,
            "samples_per_s": len(files) / dt, "mb_per_s": nbytes / 1e6 / dt,
            "peak_rss_mb": peak}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="ImageFolder-style tree (granary bench gen)")
    ap.add_argument("--work", required=True, help="where the outputs go")
    ap.add_argument("--only", default=",".join(WRITERS))
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds (each runs every writer and the CLI once; the median run is "
                         "reported, with every run's rate, and each ratio per round)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return run_child(a)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    rows, present = {}, []
    for name in a.only.split(","):
        if name not in WRITERS:
            sys.exit(f"unknown writer {name} (writers: {', '.join(WRITERS)})")
        _, module = WRITERS[name]
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
        if probe.returncode != 0:
            rows[name] = {"missing": f"{module} is not installed"}
        else:
            present.append(name)
    # Rounds: every writer, then the CLI, once per round. This VM's speed drifts by tens of
    # percent over minutes; a ratio is taken within each round, and its median and spread over
    # the rounds are reported.
    pack = "granary pack (CLI, files)"
    runs = {name: [] for name in present + [pack]}
    for _ in range(a.repeat):
        for name in present:
            p = subprocess.run([sys.executable, __file__, "--child", name, "--src", a.src,
                                "--work", a.work], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name} failed:\n{p.stderr}")
            runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            shutil.rmtree(Path(a.work) / name, ignore_errors=True)
        r = cli_pack(a)
        if r:
            runs[pack].append(r)
        shutil.rmtree(Path(a.work) / "cli-pack", ignore_errors=True)
    for name, rs in runs.items():
        if rs:
            median = sorted(rs, key=lambda r: r["samples_per_s"])[len(rs) // 2]
            rows[name] = dict(median, runs=[r["samples_per_s"] for r in rs])
        elif name == pack:
            rows[name] = None
    print(f"{'writer':28} {'samples/s':>10} {'MB/s':>8} {'peak RSS MB':>12} {'over samples':>13}"
          f"  runs in round order (samples/s)")
    for name, r in rows.items():
        if r is None or "missing" in r:
            print(f"{name:28} {(r or {}).get('missing', 'not run')}")
            continue
        over = r.get("peak_over_samples_mb")
        kids = r.get("children_peak_rss_mb", 0)
        spread = ", ".join(f"{x:.0f}" for x in r.get("runs", []))
        print(f"{name:28} {r['samples_per_s']:10.0f} {r['mb_per_s']:8.0f} {r['peak_rss_mb']:12.0f} "
              f"{'' if over is None else f'{over:.0f}'}{f' (+{kids:.0f} child)' if kids > 1 else '':>13}"
              f"  {spread}")
    peers = [n for n in present if not n.startswith("granary")]
    rounds = range(a.repeat)

    def ratio(name, over):
        """Per round: `name`'s rate over `over`'s (a name, or None for the fastest peer)."""
        if not runs.get(name) or (over is None and not peers) or (over and not runs.get(over)):
            return None
        per = []
        for i in rounds:
            base = (max(runs[p][i]["samples_per_s"] for p in peers) if over is None
                    else runs[over][i]["samples_per_s"])
            per.append(runs[name][i]["samples_per_s"] / base)
        return {"median": sorted(per)[len(per) // 2], "rounds": per}

    ratios = {}
    for name, over, what in [("granary", None, "fastest peer writer"),
                             ("granary", pack, "granary pack from files"),
                             ("granary-expected", None, "fastest peer writer"),
                             ("granary-expected", pack, "granary pack from files"),
                             (pack, None, "fastest peer writer")]:
        r = ratio(name, over)
        if r:
            label = f"{'granary pack from files' if name == pack else name} / {what}"
            ratios[label] = r
            spread = ", ".join(f"{x:.2f}" for x in r["rounds"])
            print(f"{label}: {r['median']:.2f}x (median over rounds; each round: {spread})")
    rows["ratios (within each round)"] = ratios
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
