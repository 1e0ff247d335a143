#!/usr/bin/env bash
# Times `verityfs digest` against `fsverity digest` and `openssl dgst` on the
# same file, warm page cache, in one run, and prints the ratios.
#
# Usage: scripts/bench-digest.sh [SIZE_MIB] [RUNS]
#   SIZE_MIB  size of the test file (default 1024, i.e. 1 GiB)
#   RUNS      runs per command; the median is reported (default 5)
# Environment: BENCH_DIR (default /var/tmp/verityfs-bench) holds the file;
# VERITYFS (default target/release/verityfs, built if missing).
set -euo pipefail

size_mib=${1:-1024}
runs=${2:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
verityfs=${VERITYFS:-$root/target/release/verityfs}
dir=${BENCH_DIR:-/var/tmp/verityfs-bench}
file=$dir/data-${size_mib}M

for tool in fsverity openssl taskset; do
    command -v "$tool" >/dev/null || { echo "bench: $tool not found (apt-get install fsverity openssl util-linux)" >&2; exit 1; }
done
if [ -z "${VERITYFS:-}" ]; then
    (cd "$root" && cargo build --release --quiet -p verityfs-cli)
fi
mkdir -p "$dir"
if [ ! -f "$file" ] || [ "$(stat -c %s "$file")" -ne $((size_mib << 20)) ]; then
    head -c $((size_mib << 20)) /dev/urandom >"$file"
fi
cat "$file" >/dev/null # warm the page cache

# median_seconds CMD...: runs CMD $runs times, prints the median wall time.
median_seconds() {
    local times=() start end
    for _ in $(seq "$runs"); do
        start=$(date +%s.%N)
        "$@" >/dev/null
        end=$(date +%s.%N)
        times+=("$(echo "$end - $start" | bc -l)")
    done
    printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

# Check the digests agree before timing anything.
for alg in sha256 sha512; do
    want=$(fsverity digest --hash-alg=$alg "$file")
    got=$("$verityfs" digest --hash-alg=$alg "$file")
    [ "$want" = "$got" ] || { echo "bench: digests differ: $want vs $got" >&2; exit 1; }
done

mb=$((size_mib * 1048576))
declare -A t
t[fsverity]=$(median_seconds fsverity digest "$file")
t[fsverity_1]=$(median_seconds taskset -c 0 fsverity digest "$file")
t[verityfs]=$(median_seconds "$verityfs" digest "$file")
t[verityfs_1]=$(median_seconds taskset -c 0 "$verityfs" digest "$file")
t[openssl]=$(median_seconds openssl dgst -sha256 "$file")
t[fsverity512_1]=$(median_seconds taskset -c 0 fsverity digest --hash-alg=sha512 "$file")
t[verityfs512_1]=$(median_seconds taskset -c 0 "$verityfs" digest --hash-alg=sha512 "$file")
t[verityfs512]=$(median_seconds "$verityfs" digest --hash-alg=sha512 "$file")

row() { # name key anchor_key
    printf '%-44s %8.3f s %8.0f MB/s %7.2fx\n' "$1" "${t[$2]}" \
        "$(echo "$mb / ${t[$2]} / 1000000" | bc -l)" "$(echo "${t[$3]} / ${t[$2]}" | bc -l)"
}
echo "file: $file (${size_mib} MiB, warm cache), median of $runs runs, $(nproc) CPUs"
printf '%-44s %10s %13s %8s\n' command time throughput "speed-up"
echo "SHA-256 (speed-up vs fsverity digest, same CPUs)"
row "fsverity digest" fsverity fsverity
row "verityfs digest (all CPUs)" verityfs fsverity
row "taskset -c 0 fsverity digest" fsverity_1 fsverity_1
row "taskset -c 0 verityfs digest" verityfs_1 fsverity_1
row "openssl dgst -sha256 (vs fsverity)" openssl fsverity
echo "SHA-512 (speed-up vs fsverity digest on one CPU)"
row "taskset -c 0 fsverity digest --hash-alg=sha512" fsverity512_1 fsverity512_1
row "taskset -c 0 verityfs digest --hash-alg=sha512" verityfs512_1 fsverity512_1
row "verityfs digest --hash-alg=sha512 (all CPUs)" verityfs512 fsverity512_1
