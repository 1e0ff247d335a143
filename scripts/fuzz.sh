#!/usr/bin/env bash
# Bounded fuzz run: builds the cargo-fuzz targets in fuzz/ and runs each for
# SECONDS_PER_TARGET seconds (default 10). Exits non-zero if any target
# crashes, panics, times out on an input, or runs out of memory; the input
# is saved in fuzz/artifacts/TARGET/. See fuzz/README.md for longer runs.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
#
# Only the stable toolchain is needed: cargo-fuzz passes -Z flags (the
# address sanitizer, coverage instrumentation), which RUSTC_BOOTSTRAP=1
# lets stable rustc accept. cargo-fuzz itself is installed from crates.io
# if missing; on a fresh Debian machine, run as root, the packages the build
# needs are installed too.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-10}
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2
    exit 2
fi

CARGO_FUZZ_VERSION=0.13.2

# Largest input per target: a bit past what the parser accepts, so the
# too-large paths are reached too.
targets=(descriptor location enable_arg geometry tree_small manifest)
declare -A max_len=(
    [descriptor]=16640 # 256-byte descriptor + 16128-byte signature = 16384
    [location]=64      # records are 48 and 16 bytes
    [enable_arg]=16512 # 128-byte argument + 32-byte salt + 16128-byte signature
    [geometry]=32      # a 24-byte header of numbers
    [tree_small]=65573 # 5-byte header + 32-byte salt + 64 KiB of data
    [manifest]=65536   # 2048 levels of one-byte names take 51 KiB
)
# build_merkle_tree reads on a scoped thread, which may still be exiting
# (freeing its thread handle and thread-locals) when the target returns:
# LeakSanitizer would report those as leaks now and then.
declare -A extra=(
    [tree_small]=-detect_leaks=0
)

packages=(libssl-dev pkg-config g++)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "fuzz.sh: missing packages: ${missing[*]} (run as root, or apt-get install them)" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" </dev/null
fi

export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

export RUSTC_BOOTSTRAP=1
cd fuzz
cargo fuzz build

failed=()
passed=0
total_execs=0
for t in "${targets[@]}"; do
    # New inputs go to the untracked work/ corpus; corpus/ holds the seeds.
    mkdir -p "work/$t"
    log="target/fuzz-$t.log"
    echo "== $t: ${secs}s"
    if cargo fuzz run "$t" "work/$t" "corpus/$t" -- \
        -max_total_time="$secs" -max_len="${max_len[$t]}" \
        -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 ${extra[$t]:-} >"$log" 2>&1; then
        passed=$((passed + 1))
    else
        failed+=("$t")
        # The panic message or sanitizer report, and the reproducer (the
        # full log has the backtrace and the input).
        grep -E -A4 -m3 'panicked at|==[0-9]+== ?ERROR|^SUMMARY:' "$log" | cut -c1-300 || true
        grep -E -A2 'Failing input:|Reproduce with:|Minimize test case with:' "$log" || true
        echo "full log: fuzz/$log (run those commands in fuzz/ with RUSTC_BOOTSTRAP=1)"
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
    echo "$t: ${execs:-?} executions, ${rate:-?} exec/s, peak RSS ${rss:-?} MB"
    total_execs=$((total_execs + ${execs:-0}))
done

echo "fuzz executions in total: $total_execs"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: FAILED: ${failed[*]} (inputs in fuzz/artifacts/; logs in fuzz/target/fuzz-*.log)" >&2
fi
echo "fuzz: $passed passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
