#!/usr/bin/env bash
# Runs the whole test suite. On a fresh Debian machine, run as root, it first
# installs what the tests need: the real fsverity-utils binary (the
# differential oracle), fuse3, e2fsprogs (lsattr/chattr), util-linux
# (setpriv, umount, unshare), the openssl tool (test keys and certificates),
# OpenSSL's headers (the openssl crate), python3 (the mount tests' truncate,
# ioctl and mmap helpers), systemd (systemd-escape and systemd-analyze, for
# the unit's checks), git (the README's checks), and what
# scripts/kernel-oracle.sh boots Linux with for the kernel oracle test
# (QEMU, busybox, cpio, kmod, keyutils, xz-utils; the script downloads the
# kernel package itself), and the servers of the remote image tests: nginx
# (only its binary: each test runs its own nginx on a free port of
# 127.0.0.1; on a machine running systemd, apt also starts Debian's nginx
# service on port 80, which no test needs) and python3-venv, for the venv
# of moto's S3 server this script then creates with pip from PyPI
# (crates/verityfs-testnet runs it from there), and curl (the remote
# benchmark's anchor, also run once as a test), and gdb (the backtraces in a
# hung test's report). The FUSE tests need root and
# /dev/fuse; a test missing anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(fsverity fuse3 e2fsprogs util-linux openssl libssl-dev pkg-config bc fonts-dejavu-core python3 systemd git
    qemu-system-x86 busybox-static cpio kmod keyutils xz-utils nginx python3-venv curl gdb)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test.sh: missing packages: ${missing[*]} (run as root, or apt-get install them)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# moto's S3 server, pinned, in its own venv (the place the tests look).
# Debian's python3, the one python3-venv is for, whatever else is on PATH.
moto_venv=${VERITYFS_MOTO_VENV:-/var/lib/verityfs-tests/moto}
moto=5.2.5
if ! compgen -G "$moto_venv/lib/python3*/site-packages/moto-$moto.dist-info" >/dev/null; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test.sh: missing moto $moto in $moto_venv (run as root, or: /usr/bin/python3 -m venv $moto_venv && $moto_venv/bin/pip install -q 'moto[server]==$moto')" >&2
        exit 1
    fi
    /usr/bin/python3 -m venv "$moto_venv"
    "$moto_venv/bin/pip" install -q "moto[server]==$moto"
fi

# A test that hangs fails the run after VERITYFS_TEST_MINUTES (default 60)
# and reports where every test process waits, instead of running out the
# clock with nothing said.
report_hang() {
    echo "test.sh: tests still running after $1 minutes; where their processes wait:" >&2
    for proc in /proc/[0-9]*; do
        grep -qsE 'verityfs|python3|target/' "$proc/cmdline" || continue
        grep -qs rustc "$proc/cmdline" && continue
        for task in "$proc"/task/*; do
            echo "$task $(tr '\0' ' ' <"$proc/cmdline" | cut -c1-120): $(cat "$task/wchan" 2>/dev/null)"
            cat "$task/stack" 2>/dev/null
        done
    done >&2
}
minutes=${VERITYFS_TEST_MINUTES:-60}
setsid -w cargo test --workspace --all-targets --no-fail-fast "$@" &
tests=$!
(sleep "$((minutes * 60))" && report_hang "$minutes" && kill -KILL -- "-$tests") &
watchdog=$!
status=0
wait "$tests" || status=$?
kill "$watchdog" 2>/dev/null || true
[ "$status" -eq 0 ] || exit "$status"
cargo test --workspace --doc
