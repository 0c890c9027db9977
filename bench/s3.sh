#!/usr/bin/env bash
# Training data from an S3 server: raw objects (one GET per sample) vs granary over s3://, the
# server's own ceiling, and granary with a local tier, side by side on the same server and data.
#
#   bash bench/s3.sh                      # 20,000 ImageNet-like files, report in bench-out/s3
#   FILES=2000 OUT=/tmp/s3-report bash bench/s3.sh
#   RUNS=3 bash bench/s3.sh               # raw, granary and the ceilings three times
#
# Starts SeaweedFS on 127.0.0.1 (scripts/s3-server.sh), uploads the raw tree (one object per
# file) and packs it to the server with `granary pack -o s3://...`, then runs
# bench/python/s3_loaders.py per case with the page cache dropped before each cold epoch. The
# server's ceiling is the fastest of boto3 (16 threads) and curl (16 and 64 transfers in
# flight) fetching the chunk objects whole.
# Needs the torch 2 venv of scripts/python-tests.sh (boto3 comes with its peers' requirements).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-20000}
OUT=${OUT:-bench-out/s3}
WORKERS=${WORKERS:-2}
EPOCHS=${EPOCHS:-2}
RUNS=${RUNS:-1}
VENV=${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/granary/torch2}
PY=$VENV/bin/python
if ! "$PY" -c 'import torch, boto3' 2>/dev/null; then
  echo "s3.sh: $PY lacks torch or boto3: run scripts/python-tests.sh, then $VENV/bin/pip install boto3" >&2
  exit 1
fi
cargo build --release --quiet
G=$PWD/target/release/granary
"$VENV/bin/pip" install -q --disable-pip-version-check ./python

WORK=$(mktemp -d "${TMPDIR:-/tmp}/granary-s3.XXXXXX")
cleanup() {
  bash scripts/s3-server.sh stop "$WORK/server" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$OUT"

echo "== source: $FILES ImageNet-like files, packed locally too (the local-disk rate)"
$G bench gen "$WORK/src" --files "$FILES" --classes 100 --sizes imagenet
$G pack "$WORK/src" -o "$WORK/local.granary" -q | tail -1
(cd "$WORK/src" && find . -type f -printf '%P\n' | sort) >"$WORK/keys.txt"

echo "== S3 server (SeaweedFS on 127.0.0.1)"
bash scripts/s3-server.sh start "$WORK/server"
# shellcheck disable=SC1091
source "$WORK/server/env"
# Fetched snapshots and the upload's staging directory: this run's own.
export GRANARY_SNAPSHOT_CACHE=$WORK/snapshots XDG_CACHE_HOME=$WORK/cache
RAW=s3://granary/bench/raw
DS=s3://granary/bench/train.granary

echo "== upload: raw objects (boto3, 32 threads) and granary pack -o $DS"
"$PY" - "$WORK/src" "$WORK/keys.txt" <<'EOF' | tee "$OUT/upload.txt"
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
import boto3
from botocore.config import Config
src, keys = sys.argv[1], open(sys.argv[2]).read().split()
c = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                 config=Config(max_pool_connections=32))
t0 = time.perf_counter()
def put(k):
    with open(os.path.join(src, k), "rb") as f:
        c.put_object(Bucket="granary", Key="bench/raw/" + k, Body=f.read())
with ThreadPoolExecutor(32) as ex:
    list(ex.map(put, keys))
print(f"raw upload: {len(keys)} objects in {time.perf_counter() - t0:.1f} s")
EOF
/usr/bin/time -f "granary pack -o s3://: %e s, peak RSS %M KB" \
  $G pack "$WORK/src" -o "$DS" | tee "$OUT/pack.txt"
SAMPLES=$(wc -l <"$WORK/keys.txt")
SERVER_PID=$(cat "$WORK/server/pid")
# CPU seconds of the server so far (all its threads): it shares this machine's cores with the
# client, so the client's CPU per byte is taken from the server's.
server_cpu() { awk -v t="$(getconf CLK_TCK)" '{sub(/.*\) /, ""); print ($12 + $13) / t}' "/proc/$SERVER_PID/stat"; }
BYTES=$(du -sb "$WORK/local.granary" | cut -f1)

run() { # case, extra args...
  local c=$1
  shift
  echo "== $c"
  "$PY" bench/python/s3_loaders.py --case "$c" --workers "$WORKERS" --samples "$SAMPLES" \
    --server-pid "$SERVER_PID" "$@" \
    | sed "s/^{/{\"run\": $RUN_NO, /" | tee -a "$OUT/results.jsonl"
}
# The server's ceiling from a client nobody here wrote: curl (libcurl, C) fetching every chunk
# object whole, signed (SigV4), $1 transfers at once, the page cache dropped first.
curl_ceiling() {
  local n=$1 cfg=$WORK/curl.cfg
  "$PY" - "$DS" >"$cfg" <<'PYEOF'
import os, sys, boto3
bucket, _, prefix = sys.argv[1][len("s3://"):].partition("/")
c = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for p in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
    for o in p.get("Contents", []):
        if o["Key"].endswith(".gchunk"):
            print(f'url = "{os.environ["AWS_ENDPOINT_URL"]}/{bucket}/{o["Key"]}"\noutput = "/dev/null"')
PYEOF
  sync
  echo 3 >/proc/sys/vm/drop_caches
  local t0 t1 s0 s1
  s0=$(server_cpu)
  t0=$(date +%s.%N)
  /usr/bin/time -f '%U %S' -o "$WORK/curl.cpu" \
    curl -sS --fail --parallel --parallel-max "$n" --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -K "$cfg" -w '%{size_download}\n' >"$WORK/curl.sizes"
  t1=$(date +%s.%N)
  s1=$(server_cpu)
  python3 -c "import json, sys; s = float(sys.argv[2]) - float(sys.argv[1]); b = sum(int(x) for x in open(sys.argv[3])); u, k = map(float, open(sys.argv[4]).read().split()[-2:]); print(json.dumps({'run': $RUN_NO, 'case': 'ceiling-curl-$n', 'epoch': 1, 'bytes': b, 'seconds': s, 'mb_s': b / 1e6 / s, 'samples_s': $SAMPLES / s, 'client_cpu_s': u + k, 'server_cpu_s': float(sys.argv[6]) - float(sys.argv[5])}))" "$t0" "$t1" "$WORK/curl.sizes" "$WORK/curl.cpu" "$s0" "$s1" \
    | tee -a "$OUT/results.jsonl"
}
rm -f "$OUT/results.jsonl"
for RUN_NO in $(seq "$RUNS"); do
  echo "== run $RUN_NO of $RUNS"
  run ceiling --url "$DS"
  for n in 16 64; do
    echo "== ceiling, curl, $n in flight"
    curl_ceiling "$n"
  done
  run raw --url "$RAW" --keys "$WORK/keys.txt" --epochs "$EPOCHS"
  run granary --url "$DS" --epochs "$EPOCHS"
done
run tier --url "$DS" --epochs 3 --drop every --tier "$WORK/tier" --tier-size $((BYTES * 2))
run local --local "$WORK/local.granary" --epochs 1

"$PY" - "$OUT/results.jsonl" "$RUNS" <<'EOF' | tee "$OUT/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = int(sys.argv[2])
def rate(case, epoch, run=None):
    for r in rows:
        if r["case"] == case and r["epoch"] == epoch and (run is None or r.get("run") == run):
            return r["samples_s"]
    return None
def ceiling(run):
    return max(v for v in (rate(c, 1, run) for c in ("ceiling", "ceiling-curl-16", "ceiling-curl-64")) if v)
print("| run | case | epoch 1 | epoch 2 | epoch 3 | peak RSS (largest process) |")
print("|---|---|---:|---:|---:|---:|")
names = {"raw": "(a) raw objects, one GET per sample", "granary": "(b) granary over s3://",
         "ceiling": "(c) server ceiling: whole-chunk GETs, boto3 16 threads",
         "ceiling-curl-16": "(c) server ceiling: whole-chunk GETs, curl 16 in flight",
         "ceiling-curl-64": "(c) server ceiling: whole-chunk GETs, curl 64 in flight",
         "tier": "(d) granary over s3:// + local tier (caches dropped every epoch)",
         "local": "granary on the local disk, cold"}
for run in range(1, runs + 1):
    for case in names:
        cells = []
        for e in (1, 2, 3):
            v = rate(case, e, run)
            cells.append(f"{v:,.0f}" if v else "")
        if not any(cells):
            continue
        rss = max((r.get("peak_rss_mb", 0) for r in rows if r["case"] == case and r.get("run") == run), default=0)
        print(f"| {run} | {names[case]} | " + " | ".join(cells) + (f" | {rss:,.0f} MB |" if rss else " | |"))
print()
for run in range(1, runs + 1):
    a1, b1, b2, c = rate("raw", 1, run), rate("granary", 1, run), rate("granary", 2, run), ceiling(run)
    print(f"run {run}: (c) = {c:,.0f} samples/s (the fastest client); (b)/(c) = {b1 / c:.2f} / {b2 / c:.2f} "
          f"in epochs 1 / 2 (goal >= 0.9); (b)/(a) = {b1 / a1:.1f}x (goal >= 10x)")
def row(case, epoch, run):
    return next((r for r in rows if r["case"] == case and r["epoch"] == epoch and r.get("run") == run), None)
print()
print("CPU seconds per GB delivered, epoch 1 (server + client; the two share this machine's cores):")
for run in range(1, runs + 1):
    cells = []
    for case in ("ceiling", "ceiling-curl-16", "ceiling-curl-64", "granary"):
        r = row(case, 1, run)
        if r and "server_cpu_s" in r:
            gb = r["bytes"] / 1e9
            cells.append(f"{case} {r['server_cpu_s'] / gb:.2f} + {r['client_cpu_s'] / gb:.2f}")
    g = row("granary", 1, run)
    if g and "open_s" in g:
        cells.append(f"granary's epoch 1: open {g['open_s']:.2f} s, first batch {g['first_s']:.2f} s after, "
                     f"{g['seconds']:.2f} s in all")
    print(f"run {run}: " + "; ".join(cells))
d, loc = rate("tier", 2), rate("local", 1)
print(f"(d) epoch 2 / local-disk cold = {d / loc:.2f} (goal >= 1)")
EOF
echo "report: $OUT"
