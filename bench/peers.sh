#!/usr/bin/env bash
# Tiers shared by the nodes of one job vs node-private tiers, on S3 with a limited
# origin bandwidth.
#
#   bash bench/peers.sh                  # 6,000 ImageNet-like files, origin 800 Mbit/s
#   FILES=2000 ORIGIN_MBIT=400 OUT=/tmp/peers bash bench/peers.sh
#
# Needs root: it runs in a network namespace of its own (deleted at the end), where every
# server listens on that namespace's 127.0.0.1 and an htb class on its loopback limits what the
# S3 server (SeaweedFS, scripts/s3-server.sh) sends to ORIGIN_MBIT: shared storage is the
# bottleneck, the job's own network is not. 4 "nodes" (a tier directory and a `granary serve`
# each; one rank per node) read 4 synchronized epochs (one `granary read` per rank and epoch)
# with tiers of 25 % of the dataset each, three ways: node-private tiers, shared tiers, and
# shared tiers with --locality 0.3; then a node of the shared job is killed (its reader and its
# server, SIGKILL) 1 s into an epoch. Every rank's digest is checked against a plain read of
# the same rank and epoch. Writes OUT/results.md and OUT/rows.json (default
# bench/reports/peers).
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${FILES:-6000}
ORIGIN_MBIT=${ORIGIN_MBIT:-800}
OUT=${OUT:-bench/reports/peers}
EPOCHS=${EPOCHS:-4}

if [[ ${GRANARY_PEERS_INNER:-} != 1 ]]; then
  if [[ $(id -u) != 0 ]]; then
    echo "peers.sh: needs root (a network namespace and a tc class on its loopback)" >&2
    exit 1
  fi
  # GRANARY_BIN: a granary binary already built (to compare two); else a release build.
  [ -n "${GRANARY_BIN:-}" ] || cargo build --release --quiet
  ns=granary-peers-$$
  ip netns add "$ns"
  trap 'ip netns del "$ns"' EXIT
  ip netns exec "$ns" ip link set lo up
  GRANARY_PEERS_INNER=1 ip netns exec "$ns" bash "$0" "$@"
  exit
fi

G=${GRANARY_BIN:-$PWD/target/release/granary}
# The job's secret: every server demands it and every reader signs with it (granary serve
# refuses to start without one).
GRANARY_PEER_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export GRANARY_PEER_SECRET
WORK=$(mktemp -d "${TMPDIR:-/tmp}/granary-peers.XXXXXX")
cleanup() {
  bash scripts/s3-server.sh stop "$WORK/server" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$OUT"

echo "== S3 server (SeaweedFS on this namespace's 127.0.0.1)"
bash scripts/s3-server.sh start "$WORK/server"
# shellcheck disable=SC1091
source "$WORK/server/env"
export GRANARY_SNAPSHOT_CACHE=$WORK/snapshots XDG_CACHE_HOME=$WORK/cache
port=${AWS_ENDPOINT_URL##*:}

echo "== $FILES ImageNet-like files, packed to s3://granary/peers/train.granary"
$G bench gen "$WORK/src" --files "$FILES" --classes 100 --sizes imagenet
$G pack "$WORK/src" -o s3://granary/peers/train.granary --chunk-size 8MiB | tail -1
rm -rf "$WORK/src"
bytes=$($G info s3://granary/peers/train.granary --json | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["bytes_chunks"])')

echo "== origin limited to $ORIGIN_MBIT Mbit/s (what the S3 port sends); the rest unlimited"
tc qdisc add dev lo root handle 1: htb default 10 r2q 1000
tc class add dev lo parent 1: classid 1:10 htb rate 40gbit
tc class add dev lo parent 1: classid 1:20 htb rate "${ORIGIN_MBIT}mbit"
tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport "$port" 0xffff flowid 1:20

python3 bench/peers.py --granary "$G" --dataset s3://granary/peers/train.granary \
  --data-bytes "$bytes" --work "$WORK/jobs" --epochs "$EPOCHS" | tee "$WORK/rows.jsonl"
cp "$WORK/jobs/rows.json" "$OUT/rows.json"
python3 - "$OUT/rows.json" "$FILES" "$bytes" "$ORIGIN_MBIT" >"$OUT/results.md" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
files, data, mbit = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print(f"# Shared tiers vs node-private tiers\n")
print(f"{files} ImageNet-like files, {data / 1e6:.0f} MB in 8 MiB chunks on S3 (SeaweedFS), "
      f"origin limited to {mbit} Mbit/s; 4 nodes, one rank each, tiers of 25 % each.\n")
print("| config | epoch | ranks done | wall s | samples/s | from origin (readers) | "
      "origin share | origin sent (tc) | from own tier | from peers | peak RSS MB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    kill = ""
    if r["killed_node"] is not None:
        kill = (f" (node {r['killed_node']} killed; marked down by "
                f"{r['ranks_marking_down']} of {r['ranks_finished']} ranks)")
    print(f"| {r['config']}{kill} | {r['epoch']} | {r['ranks_finished']} | {r['wall_s']} | "
          f"{r['samples_per_s']} | {r['origin_bytes_readers'] / 1e6:.0f} MB | "
          f"{100 * r['origin_share']:.1f} % | {r['origin_bytes_tc'] / 1e6:.0f} MB | "
          f"{r['local_tier_bytes'] / 1e6:.0f} MB | {r['peer_bytes'] / 1e6:.0f} MB | "
          f"{r['peak_rss_mb']} |")
print("\nEvery rank's digest equals a plain read of the same rank and epoch.")
EOF
cat "$OUT/results.md"
