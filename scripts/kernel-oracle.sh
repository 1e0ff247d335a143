#!/usr/bin/env bash
# Runs a command under a real Linux kernel with fs-verity: Debian's 6.12
# kernel booted under QEMU (TCG emulation: no KVM needed), with an ext4
# scratch disk made with `-O verity`. The guest chroots into the host's
# root filesystem (shared read-only over 9p), so every program here
# (bash, fsverity, test binaries) runs unchanged under that kernel.
#
#   scripts/kernel-oracle.sh [OPTIONS] [--] COMMAND [ARG...]
#
# COMMAND runs as root in the current directory (not under /tmp, /run, /dev,
# /proc or /sys: the guest mounts its own). Its stdout, stderr and exit
# status become this script's. Inside the guest:
#   VERITYFS_ORACLE=1
#   VERITYFS_ORACLE_SCRATCH  the ext4 verity scratch disk (/dev/vda), mounted
#                            (QEMU cache=unsafe: fast, but for power cuts
#                            attach the disk under test with --drive)
#   VERITYFS_ORACLE_IO       a writable directory shared with the host
#                            (--out DIR, else a temporary directory)
#   /dev/vdb, /dev/vdc...    the --drive images, in order, not mounted
#
# Options:
#   --out DIR            keep the shared directory in DIR (created if needed);
#                        it also gets console.log (the guest's console)
#   --env NAME=VALUE     set a variable for COMMAND (repeatable)
#   --scratch-image F    use image F as the scratch disk: made (1 GiB ext4
#                        -O verity) only if F does not exist, kept afterwards
#   --drive F[,cache=M]  attach raw image F as the next virtio disk, with
#                        QEMU cache mode M (default writeback); repeatable
#   --kill-after SECS    SIGKILL QEMU (a power cut) SECS seconds (a decimal)
#                        after the file $VERITYFS_ORACLE_IO/cut appears
#                        (COMMAND creates it when the moment comes); exit 137
#   --timeout SECS       kill QEMU after SECS seconds (default 600); exit 124
#   --prepare            only install the packages and build the cache
#
# Exit status: COMMAND's, 124 on timeout, 125 if the VM failed (the console
# log is printed), 137 after --kill-after.
#
# Environment: VERITYFS_ORACLE_CACHE, the cache directory (default
# /var/cache/verityfs-oracle): the kernel package and the initramfs, built
# once; VERITYFS_ORACLE_KERNEL pins a kernel package (e.g.
# linux-image-6.12.118+deb12-amd64-unsigned).
set -euo pipefail
shopt -s inherit_errexit

die() {
    echo "kernel-oracle: $*" >&2
    exit 125
}

# ---------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------

packages=(qemu-system-x86 busybox-static cpio kmod keyutils xz-utils e2fsprogs)

install_packages() {
    local missing=() p
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || die "missing packages: ${missing[*]} (run as root, or apt-get install them)"
    apt-get update -qq </dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" </dev/null >&2
}

# ---------------------------------------------------------------------------
# The kernel and the initramfs, built once into the cache
# ---------------------------------------------------------------------------

cache=${VERITYFS_ORACLE_CACHE:-/var/cache/verityfs-oracle}

# Modules the guest needs (with their dependencies); those built into the
# kernel are skipped.
wanted_modules=(virtio_pci virtio_blk ext4 crc32c_generic 9p 9pnet_virtio fuse)

# Newest package name matching the regular expression $1.
newest_package() {
    apt-cache search --names-only "$1" 2>/dev/null | awk '{print $1}' | sort -V | tail -n 1
}

# The kernel package to use: 6.12 first (sub-page Merkle tree blocks, FUSE
# forwarding the verity ioctls), Debian 12's default kernel otherwise.
choose_kernel() {
    if [ -n "${VERITYFS_ORACLE_KERNEL:-}" ]; then
        echo "$VERITYFS_ORACLE_KERNEL"
        return
    fi
    local patterns=('^linux-image-6\.12\.[0-9.]*\+deb12-amd64-unsigned$'
        '^linux-image-6\.12\.[0-9.]*\+deb12-amd64$'
        '^linux-image-[0-9][0-9.-]*-amd64-unsigned$'
        '^linux-image-[0-9][0-9.-]*-amd64$')
    local attempt pattern pkg
    for attempt in cached updated; do
        for pattern in "${patterns[@]}"; do
            pkg=$(newest_package "$pattern")
            if [ -n "$pkg" ]; then
                case $pkg in
                *6.12.*) ;;
                *) echo "kernel-oracle: warning: no Debian 6.12 kernel found, using $pkg" \
                    "(older kernels refuse Merkle tree blocks smaller than a page)" >&2 ;;
                esac
                echo "$pkg"
                return
            fi
        done
        [ "$attempt" = updated ] || apt-get update -qq </dev/null >&2 || true
    done
    die "no Debian amd64 kernel package found with apt-cache search (tried: ${patterns[*]})"
}

# The modules of $1 (a module name) and of all it depends on, in load
# order, as paths relative to the modules directory $2 (from modules.dep).
module_closure() {
    local name=$1 dir=$2 line path dep
    line=$(grep -E "(^|/)${name//_/[_-]}\.ko(\.xz)?:" "$dir/modules.dep" || true)
    if [ -z "$line" ]; then
        grep -qE "(^|/)${name//_/[_-]}\.ko$" "$dir/modules.builtin" ||
            die "module $name is neither in modules.dep nor built in"
        return
    fi
    path=${line%%:*}
    for dep in ${line#*:}; do
        dep=$(basename "$dep")
        module_closure "${dep%%.ko*}" "$dir"
    done
    echo "$path"
}

# The guest's /init: mounts, modules, the shares, then COMMAND in a chroot
# of the host's root filesystem.
write_init() {
    cat >"$1" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do
    insmod "/modules/$m" || echo "oracle-init: insmod $m failed"
done
fail() {
    echo "oracle-init: $*"
    poweroff -f
}
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro" host /host || fail "cannot mount the host's root filesystem"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs shm /host/dev/shm
mount -t devpts pts /host/dev/pts
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
mkdir -p /host/tmp/oracle/io /host/tmp/oracle/scratch
mount -t 9p -o "$opts" io /host/tmp/oracle/io || fail "cannot mount the io share"
mount -t ext4 /dev/vda /host/tmp/oracle/scratch || fail "cannot mount the scratch disk"
echo booted >/host/tmp/oracle/io/booted
chroot /host /usr/bin/env -i HOME=/root TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash /tmp/oracle/io/run.sh </dev/null
umount /host/tmp/oracle/scratch 2>/dev/null || sync
echo done >/host/tmp/oracle/io/done
sync
poweroff -f
EOF
    chmod 755 "$1"
}

# Downloads the kernel package and builds vmlinuz and initrd.cpio into
# $cache/$pkg; prints that directory.
build_cache() {
    local pkg=$1 dir=$cache/$pkg
    [ -f "$dir/complete" ] && { echo "$dir"; return; }
    local work
    work=$(mktemp -d "$cache/build.XXXXXX")
    # apt-get download drops privileges to _apt when it can write there.
    chmod 755 "$work"
    (
        cd "$work"
        apt-get download "$pkg" </dev/null >&2 || die "apt-get download $pkg failed"
        dpkg-deb -x ./*.deb root
        local version
        version=$(ls root/lib/modules)
        [ -n "$version" ] || die "$pkg has no modules"
        depmod -b root "$version"
        local mods=root/lib/modules/$version m
        mkdir -p initrd/bin initrd/proc initrd/sys initrd/dev initrd/host initrd/modules
        cp /bin/busybox initrd/bin/busybox
        : >initrd/modules.order
        for m in "${wanted_modules[@]}"; do
            module_closure "$m" "$mods"
        done | awk '!seen[$0]++' | while read -r m; do
            local base
            base=$(basename "$m")
            case $m in
            *.xz) xz -dc "$mods/$m" >"initrd/modules/${base%.xz}" ;;
            *) cp "$mods/$m" "initrd/modules/$base" ;;
            esac
            echo "${base%.xz}" >>initrd/modules.order
        done
        write_init initrd/init
        (cd initrd && find . | cpio -o -H newc --quiet) >initrd.cpio
        mkdir pkg
        cp root/boot/vmlinuz-"$version" pkg/vmlinuz
        mv initrd.cpio pkg/
        echo "$version" >pkg/version
        touch pkg/complete
    )
    rm -rf "$dir"
    mv "$work/pkg" "$dir"
    rm -rf "$work"
    echo "$dir"
}

# The cache directory of a usable kernel: one already built, else the
# chosen package, built now (under a lock: tests may boot in parallel).
prepare() {
    mkdir -p "$cache"
    exec 9>"$cache/lock"
    flock 9
    # What a build that failed left (no other build runs: the lock).
    rm -rf "$cache"/build.*
    local dir pkg
    if [ -n "${VERITYFS_ORACLE_KERNEL:-}" ]; then
        pkg=$VERITYFS_ORACLE_KERNEL
    else
        dir=$(ls -d "$cache"/linux-image-*/complete 2>/dev/null | sort -V | tail -n 1 || true)
        [ -n "$dir" ] && { dirname "$dir"; exec 9>&-; return; }
        pkg=$(choose_kernel)
    fi
    build_cache "$pkg"
    exec 9>&-
}

# ---------------------------------------------------------------------------
# Running the command
# ---------------------------------------------------------------------------

out=
envs=()
scratch_image=
drives=()
kill_after=
timeout=600
only_prepare=
while [ $# -gt 0 ]; do
    case $1 in
    --out) out=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --scratch-image) scratch_image=$2; shift 2 ;;
    --drive) drives+=("$2"); shift 2 ;;
    --kill-after) kill_after=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --prepare) only_prepare=1; shift ;;
    --) shift; break ;;
    -*) die "unknown option $1" ;;
    *) break ;;
    esac
done
[ -n "$only_prepare" ] || [ $# -gt 0 ] || die "usage: $0 [OPTIONS] [--] COMMAND [ARG...]"
[ "$(id -u)" -eq 0 ] || die "must run as root (9p passthrough of the root filesystem)"

install_packages
kernel=$(prepare)
[ -n "$only_prepare" ] && { echo "kernel-oracle: ready: $kernel"; exit 0; }

work=$(mktemp -d "${TMPDIR:-/tmp}/kernel-oracle.XXXXXX")
qemu_pid=
cleanup() {
    [ -n "$qemu_pid" ] && kill -9 "$qemu_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
if [ -z "$out" ]; then
    out=$work/io
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/stdout" "$out/stderr" "$out/status" "$out/booted" "$out/done" "$out/cut"

if [ -z "$scratch_image" ]; then
    scratch_image=$work/scratch.img
fi
if [ ! -e "$scratch_image" ]; then
    truncate -s 1G "$scratch_image"
    mkfs.ext4 -q -F -b 4096 -O verity "$scratch_image"
fi

{
    echo 'export VERITYFS_ORACLE=1 VERITYFS_ORACLE_SCRATCH=/tmp/oracle/scratch VERITYFS_ORACLE_IO=/tmp/oracle/io'
    for e in "${envs[@]}"; do
        printf 'export %q\n' "$e"
    done
    printf 'cd %q 2>/dev/null || {\n' "$PWD"
    printf '    echo %q >/tmp/oracle/io/stderr\n' \
        "kernel-oracle: the current directory $PWD is not in the guest, which has its own /tmp, /run, /dev, /proc and /sys"
    echo '    echo 125 >/tmp/oracle/io/status; exit; }'
    printf '%q ' "$@"
    echo '>/tmp/oracle/io/stdout 2>/tmp/oracle/io/stderr'
    echo 'echo $? >/tmp/oracle/io/status'
} >"$out/run.sh"

# no_timer_check: on a loaded machine the emulated CPU can be too slow for
# the kernel's boot-time check of the timer interrupt, which then panics
# ("IO-APIC + timer doesn't work!").
args=(-accel tcg,thread=multi -cpu max -m 2048 -smp 2
    -kernel "$kernel/vmlinuz" -initrd "$kernel/initrd.cpio"
    -append "console=ttyS0 quiet panic=-1 no_timer_check"
    -display none -monitor none -serial "file:$work/console.log" -no-reboot
    -virtfs "local,path=/,mount_tag=host,security_model=passthrough,readonly=on,multidevs=remap"
    -virtfs "local,path=$out,mount_tag=io,security_model=passthrough,multidevs=remap"
    -drive "file=$scratch_image,format=raw,if=virtio,cache=unsafe")
for d in "${drives[@]}"; do
    case $d in
    *,cache=*) args+=(-drive "file=${d%%,cache=*},format=raw,if=virtio,cache=${d##*,cache=}") ;;
    *) args+=(-drive "file=$d,format=raw,if=virtio") ;;
    esac
done

# Runs QEMU until the guest powers off, the deadline passes (result 124) or
# the --kill-after moment comes (result 137).
run_qemu() {
    qemu-system-x86_64 "${args[@]}" </dev/null >"$work/qemu.log" 2>&1 &
    qemu_pid=$!
    local cut_at=
    result=
    while kill -0 "$qemu_pid" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            kill -9 "$qemu_pid"
            result=124
            break
        fi
        if [ -n "$kill_after" ] && [ -e "$out/cut" ]; then
            [ -n "$cut_at" ] || cut_at=$(date +%s.%N)
            if awk -v now="$(date +%s.%N)" -v at="$cut_at" -v d="$kill_after" 'BEGIN { exit !(now - at >= d) }'; then
                kill -9 "$qemu_pid"
                result=137
                break
            fi
            sleep 0.01
            continue
        fi
        sleep 0.1
    done
    wait "$qemu_pid" 2>/dev/null || true
    qemu_pid=
}

started=$(date +%s.%N)
deadline=$(($(date +%s) + timeout))
for attempt in 1 2 3; do
    run_qemu
    # Under heavy load, emulation can be too slow for the kernel's early
    # checks (it panics before the guest comes up): boot again.
    if [ -n "$result" ] || [ -e "$out/booted" ] || [ "$attempt" -eq 3 ]; then
        break
    fi
    echo "kernel-oracle: the kernel did not come up (attempt $attempt), booting again:" >&2
    grep -m 3 -E "panic|Kernel" "$work/console.log" >&2 || true
done
cp "$work/console.log" "$out/console.log" 2>/dev/null || true
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

case $result in
124) echo "kernel-oracle: timed out after ${timeout}s; QEMU killed; console:" >&2 ;;
137) echo "kernel-oracle: QEMU killed ${kill_after}s after the cut signal" >&2 ;;
esac
[ -f "$out/stdout" ] && cat "$out/stdout"
[ -f "$out/stderr" ] && cat "$out/stderr" >&2
if [ -z "$result" ]; then
    if [ -f "$out/status" ]; then
        result=$(cat "$out/status")
        echo "kernel-oracle: $(cat "$kernel/version"), ${elapsed}s from start to power-off, status $result" >&2
    else
        echo "kernel-oracle: the VM ended without running the command; QEMU:" >&2
        cat "$work/qemu.log" >&2
        echo "console:" >&2
        result=125
    fi
fi
if [ "$result" = 124 ] || [ "$result" = 125 ]; then
    tail -n 40 "$work/console.log" >&2 || true
fi
exit "$result"
