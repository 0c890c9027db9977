# Sourced by the benchmark scripts: with WORK and REPORT set, makes both directories (WORK made
# absolute), builds the release binary and copies it to $G in WORK (rebuilding the tree's binary
# during a long run must not change the one measured), and defines `drop`.

mkdir -p "$WORK" "$REPORT"
WORK=$(cd "$WORK" && pwd)
cargo build -q --release --bin granary
G=$WORK/granary
cp "${CARGO_TARGET_DIR:-target}/release/granary" "$G"

# Drops the page cache (as root), or says that the runs are warm.
drop() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches
    else echo "warning: cannot drop the page cache (not root): runs are warm" >&2; fi
}
