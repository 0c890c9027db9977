#!/usr/bin/env bash
# The wheels, tested where they claim to run (scripts/test.sh runs this; needs root):
#   x86_64   installed in the oldest Debian userland the configured Debian mirror serves (a
#            debootstrap chroot: bullseye, glibc 2.31 and Python 3.9, while buster is no longer
#            served), with nothing to build, and the Python test suite run there through the
#            wheel's own `granary` command (no torch in that userland: its tests skip).
#   aarch64  cross-built here, installed in an arm64 chroot of the same release, run under
#            qemu-user (binfmt_misc): scripts/wheel-smoke.py (pack with the wheel's command,
#            verify, read an epoch, Dataset / IterableDataset / Writer round trips).
# What it downloads and builds stays outside the clone, under ${XDG_CACHE_HOME:-~/.cache}/granary
# (chroots/, and wheel-target/ for the builds), as the torch venv does: a second run starts the
# chroots in seconds and rebuilds only granary's own crates.
#
#   bash scripts/test-wheels.sh            # both
#   bash scripts/test-wheels.sh x86_64     # or one
#
# An x86_64 wheel already in target/wheel (scripts/python-tests.sh builds it) is tested as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(x86_64 aarch64)
if [ "$(id -u)" != 0 ]; then
  echo "test-wheels: needs root (debootstrap, chroot, binfmt_misc)" >&2
  exit 1
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "test-wheels: written for an x86_64 host (found $(uname -m))" >&2
  exit 1
fi
cache=${XDG_CACHE_HOME:-$HOME/.cache}/granary
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
if [[ " ${archs[*]} " == *" aarch64 "* ]]; then
  [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ] || [ -x /usr/bin/qemu-aarch64-static ] ||
    need+=(qemu-user-static)
  command -v update-binfmts >/dev/null || need+=(binfmt-support)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "test-wheels: installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The Debian mirror apt uses here, and the oldest release it still serves.
mirror=$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list)
release=
for r in buster bullseye bookworm; do
  if curl -fs -o /dev/null --max-time 20 "$mirror/dists/$r/Release"; then
    release=$r
    break
  fi
done
[ -n "$release" ] || { echo "test-wheels: $mirror serves none of buster, bullseye, bookworm" >&2; exit 1; }

# A chroot of $release for Debian architecture $1, with Python, pytest and numpy from Debian.
chroot_of() {
  local dir="$cache/chroots/$release-$1"
  if ! [ -x "$dir/usr/bin/python3" ]; then
    echo "test-wheels: debootstrap $release ($1) into $dir" >&2
    rm -rf "$dir.partial"
    mkdir -p "$cache/chroots"
    debootstrap --arch="$1" --variant=minbase \
      --include=python3,python3-venv,python3-pytest,python3-numpy,ca-certificates \
      "$release" "$dir.partial" "$mirror" >"$cache/chroots/$release-$1.log" 2>&1 ||
      { tail -20 "$cache/chroots/$release-$1.log" >&2; exit 1; }
    mv "$dir.partial" "$dir"
  fi
  echo "$dir"
}

# Runs `bash -c $2` in chroot $1 in a mount namespace of its own (/proc, /dev, /sys bound in;
# gone when it ends), with the wheel installed in a fresh venv on PATH. The S3 test server's
# variables pass through when set (scripts/test.sh starts it on 127.0.0.1, which the chroot
# shares), so the object-store tests run there too.
in_chroot() {
  local pass=() v
  for v in AWS_ENDPOINT_URL AWS_ALLOW_HTTP AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION \
    GRANARY_TEST_S3 GRANARY_TEST_HTTP GRANARY_REQUIRE_S3; do
    [ -z "${!v:-}" ] || pass+=("$v=${!v}")
  done
  unshare --mount --propagation private bash -c '
    set -e
    root=$1 script=$2
    shift 2
    for d in proc dev sys; do mount --rbind "/$d" "$root/$d"; done
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    exec chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/opt/granary-venv/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" /bin/bash -c "$script"
  ' _ "$1" "$2" "${pass[@]}"
}

# Copies $2 (a wheel) and the tests into chroot $1 and installs the wheel, with no network and
# nothing to build, into a fresh venv; checks the command's version against the module's.
install_wheel() {
  local root=$1 wheel=$2
  rm -rf "$root/opt/granary-test" "$root/opt/granary-venv"
  mkdir -p "$root/opt/granary-test"
  cp "$wheel" "$root/opt/granary-test/"
  cp -r python/tests scripts/wheel-smoke.py "$root/opt/granary-test/"
  in_chroot "$root" '
    set -e
    python3 -m venv --system-site-packages /opt/granary-venv
    pip install -q --no-index --no-deps --only-binary=:all: /opt/granary-test/*.whl
    v=$(granary --version | head -1)
    m=$(cd /opt && python3 -c "import granary; print(granary.__version__)")
    [ "$v" = "granary $m" ] || { echo "granary --version: $v; the module: $m" >&2; exit 1; }
    echo "installed: $v in $(ldd --version | head -1), Python $(python3 -V | cut -d" " -f2), $(uname -m)"
  '
}

wheel_for() { # the wheel of architecture $1, built if target/wheel has none
  local w
  w=$(ls target/wheel/granary-*"_$1".whl 2>/dev/null | head -1 || true)
  if [ -z "$w" ]; then
    w=$(CARGO_TARGET_DIR="$cache/wheel-target" bash scripts/build-wheel.sh "$1" | tail -1)
  fi
  echo "$w"
}

status=0
# Runs `bash -c $3` in chroot $2 and reports it as "wheels: $1: passed" (or failed).
run_case() {
  if in_chroot "$2" "$3"; then
    echo "wheels: $1: passed"
  else
    echo "wheels: $1: failed"
    status=1
  fi
}
for arch in "${archs[@]}"; do
  case "$arch" in
    x86_64)
      wheel=$(wheel_for x86_64)
      root=$(chroot_of amd64)
      install_wheel "$root" "$wheel"
      # The suite, from /opt so that the installed package is imported; its fixtures pack with
      # the wheel's command (no GRANARY_BIN, no target/ there).
      run_case "x86_64 in $release" "$root" \
        'cd /opt/granary-test && python3 -m pytest -p no:cacheprovider -q -rs tests'
      ;;
    aarch64)
      if ! [ -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
      fi
      update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
      [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] ||
        { echo "test-wheels: cannot register qemu-aarch64 with binfmt_misc" >&2; exit 1; }
      wheel=$(wheel_for aarch64)
      root=$(chroot_of arm64)
      install_wheel "$root" "$wheel"
      run_case "aarch64 in $release under qemu" "$root" 'cd /opt && python3 /opt/granary-test/wheel-smoke.py'
      ;;
    *)
      echo "test-wheels: unsupported architecture $arch" >&2
      exit 2
      ;;
  esac
done
exit "$status"
