"""Tiers shared by the nodes of one job vs node-private tiers: the driver that
bench/peers.sh runs inside its network namespace. Standard library only.

Each "node" is a directory with its own tier and (when shared) a `granary serve` process; each
epoch starts one `granary read` per rank (one rank per node) at once and waits for all of them,
as DDP's epochs do. Origin bytes are counted twice: by the readers (bytes they read from origin
storage) and by the kernel (bytes the S3 server's port sent, from the tc class that limits it).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time


def tc_sent(classid):
    out = subprocess.run(["tc", "-s", "class", "show", "dev", "lo", "classid", classid],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Sent (\d+) bytes", out)
    return int(m.group(1)) if m else 0


def plain_digest(g, ds, rank, epoch, world, locality):
    out = subprocess.run([g, "read", ds, "--json", "--rank", str(rank), "--world-size", str(world),
                          "--first-epoch", str(epoch), "--locality", str(locality)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["digest"]


class Job:
    def __init__(self, a, name, shared, locality):
        self.a, self.name, self.shared, self.locality = a, name, shared, locality
        self.dirs = [os.path.join(a.work, name, f"node{i}") for i in range(a.nodes)]
        self.servers, self.addrs = [], []
        for d in self.dirs:
            os.makedirs(d, exist_ok=True)
        if shared:
            for d in self.dirs:
                p = subprocess.Popen([a.granary, "serve", a.dataset, "--cache-dir", d, "--listen",
                                      "127.0.0.1:0"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
                line = p.stdout.readline().strip()
                if not line.startswith("listening on http://"):
                    sys.exit(f"granary serve printed {line!r}")
                self.servers.append(p)
                self.addrs.append(line[len("listening on http://"):])

    def stop(self):
        for p in self.servers:
            if p.poll() is None:
                p.kill()
            p.wait()

    def start_rank(self, r, epoch):
        a = self.a
        args = [a.granary, "read", a.dataset, "--json", "--rank", str(r), "--world-size",
                str(a.nodes), "--first-epoch", str(epoch), "--cache-dir", self.dirs[r],
                "--cache-size", str(a.quota), "--locality", str(self.locality)]
        if self.shared:
            args += ["--peers", ",".join(self.addrs), "--ownership-epoch", "0"]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def epoch(self, epoch, kill_node=None, kill_after=1.0):
        a = self.a
        sent0 = tc_sent("1:20")
        t0 = time.perf_counter()
        procs = [self.start_rank(r, epoch) for r in range(a.nodes)]
        killed = None
        if kill_node is not None:
            time.sleep(kill_after)
            # The node dies: its reader and its server (SIGKILL, both started here).
            procs[kill_node].kill()
            self.servers[kill_node].kill()
            killed = kill_node
        outs = [p.communicate() for p in procs]
        # The epoch ends when its last rank does; the checks below read origin too.
        wall = time.perf_counter() - t0
        origin_sent = tc_sent("1:20") - sent0
        reports = []
        for r, (p, (out, err)) in enumerate(zip(procs, outs)):
            if r == killed:
                continue
            if p.returncode != 0:
                sys.exit(f"{self.name}: rank {r} epoch {epoch} failed: {err}")
            rep = json.loads(out)[0]
            want = plain_digest(a.granary, a.dataset, r, epoch, a.nodes, self.locality)
            if rep["digest"] != want:
                sys.exit(f"{self.name}: rank {r} epoch {epoch}: digest {rep['digest']} != {want}")
            reports.append(rep)

        def served(r, layer):
            # What one layer of the rank's stack served of its own ("layers" in read --json).
            return sum(x["served_bytes"] for x in r["layers"] if x["layer"] == layer)

        row = {
            "config": self.name,
            "epoch": epoch,
            "ranks_finished": len(reports),
            "killed_node": killed,
            "samples": sum(r["samples"] for r in reports),
            "wall_s": round(wall, 2),
            "samples_per_s": round(sum(r["samples"] for r in reports) / wall),
            "origin_bytes_readers": sum(served(r, "origin") for r in reports),
            "origin_bytes_tc": origin_sent,
            "local_tier_bytes": sum(served(r, "tier") for r in reports),
            "peer_bytes": sum(served(r, "peers") for r in reports),
            "peak_rss_mb": max(round(r["peak_rss_bytes"] / 1e6) for r in reports),
            "digests_ok": True,
        }
        if self.shared:
            row["ownership"] = sorted({r["peers"]["ownership"] for r in reports})
            row["down"] = sorted({d for r in reports for d in r["peers"]["down"]})
            row["ranks_marking_down"] = sum(1 for r in reports if r["peers"]["down"])
        row["origin_share"] = round(row["origin_bytes_readers"] / a.data_bytes, 3)
        print(json.dumps(row), flush=True)
        return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--granary", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--data-bytes", type=int, required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--tier-share", type=float, default=0.25)
    p.add_argument("--locality", type=float, default=0.3)
    a = p.parse_args()
    a.quota = int(a.data_bytes * a.tier_share) + 1
    rows = []
    for name, shared, loc in [("private", False, 1.0), ("shared", True, 1.0),
                              (f"shared, locality {a.locality}", True, a.locality)]:
        job = Job(a, name, shared, loc)
        try:
            for e in range(a.epochs):
                rows.append(job.epoch(e))
            if shared and loc == 1.0:
                # A node dies mid-epoch (40 % into the last epoch's time): every other rank
                # finishes, every sample right.
                rows.append(job.epoch(a.epochs, kill_node=a.nodes - 1,
                                      kill_after=0.4 * rows[-1]["wall_s"]))
        finally:
            job.stop()
    with open(os.path.join(a.work, "rows.json"), "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
