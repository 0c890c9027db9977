#!/usr/bin/env bash
# Training data from an S3 server: raw objects (one GET per sample) vs granary over s3://, the
# server's own ceiling, and granary with a local tier, side by side on the same server and data.
#
#   bash bench/s3.sh                      # 20,000 ImageNet-like files, report in bench-out/s3
#   FILES=2000 OUT=/tmp/s3-report bash bench/s3.sh
#
# Starts SeaweedFS on 127.0.0.1 (scripts/s3-server.sh), uploads the raw tree (one object per
# file) and packs it to the server with `granary pack -o s3://...`, then runs
# bench/python/s3_loaders.py per case with the page cache dropped before each cold epoch.
# Needs the torch 2 venv of scripts/python-tests.sh (boto3 comes with its peers' requirements).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-20000}
OUT=${OUT:-bench-out/s3}
WORKERS=${WORKERS:-2}
EPOCHS=${EPOCHS:-2}
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
BYTES=$(du -sb "$WORK/local.granary" | cut -f1)

run() { # case, extra args...
  local c=$1
  shift
  echo "== $c"
  "$PY" bench/python/s3_loaders.py --case "$c" --workers "$WORKERS" --samples "$SAMPLES" "$@" \
    | tee -a "$OUT/results.jsonl"
}
rm -f "$OUT/results.jsonl"
run ceiling --url "$DS"
run raw --url "$RAW" --keys "$WORK/keys.txt" --epochs "$EPOCHS"
run granary --url "$DS" --epochs "$EPOCHS"
run tier --url "$DS" --epochs 3 --drop every --tier "$WORK/tier" --tier-size $((BYTES * 2))
run local --local "$WORK/local.granary" --epochs 1

"$PY" - "$OUT/results.jsonl" <<'EOF' | tee "$OUT/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def rate(case, epoch):
    for r in rows:
        if r["case"] == case and r["epoch"] == epoch:
            return r["samples_s"]
    return None
print("| case | epoch 1 | epoch 2 | epoch 3 | peak RSS (largest process) |")
print("|---|---:|---:|---:|---:|")
names = {"raw": "(a) raw objects, one GET per sample", "granary": "(b) granary over s3://",
         "ceiling": "(c) server ceiling: parallel whole-chunk GETs",
         "tier": "(d) granary over s3:// + local tier (caches dropped every epoch)",
         "local": "granary on the local disk, cold"}
for case in ["raw", "granary", "ceiling", "tier", "local"]:
    cells = []
    for e in (1, 2, 3):
        v = rate(case, e)
        cells.append(f"{v:,.0f}" if v else "")
    rss = max((r.get("peak_rss_mb", 0) for r in rows if r["case"] == case), default=0)
    print(f"| {names[case]} | " + " | ".join(cells) + f" | {rss:,.0f} MB |" if rss else
          f"| {names[case]} | " + " | ".join(cells) + " | |")
a, b, c = rate("raw", 1), rate("granary", 1), rate("ceiling", 1)
d, loc = rate("tier", 2), rate("local", 1)
print()
print(f"(b)/(c) = {b / c:.2f} (goal >= 0.9); (b)/(a) = {b / a:.1f}x (goal >= 10x); "
      f"(d) epoch 2 / local-disk cold = {d / loc:.2f} (goal >= 1)")
EOF
echo "report: $OUT"
