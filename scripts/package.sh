#!/usr/bin/env bash
# Builds the Debian package of verityfs and checks its contents.
#
#   scripts/package.sh            # -> target/debian/verityfs_<version>-1_<arch>.deb
#
# 1. builds `verityfs` in release mode and writes its man pages and shell
#    completions with `verityfs generate-docs target/generated` (in the
#    repository, whatever CARGO_TARGET_DIR says: the package's assets are
#    taken from there);
# 2. runs `cargo deb -p verityfs-cli` (installing cargo-deb from crates.io
#    first if it is missing: `cargo install cargo-deb --locked`, a few
#    minutes);
# 3. unpacks the .deb into a scratch root with `dpkg-deb -x` and checks that
#    every expected file is there, that the binary runs and that the
#    package depends on fuse3. Exits non-zero otherwise.
#
# Honours CARGO_TARGET_DIR. Install the result with
#   apt-get install ./target/debian/verityfs_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}

if ! cargo deb --version >/dev/null 2>&1; then
    echo "package.sh: installing cargo-deb" >&2
    cargo install cargo-deb --locked
fi

cargo build --release --locked -p verityfs-cli
rm -rf target/generated
"$target/release/verityfs" generate-docs target/generated >/dev/null

# --no-build: the binary was just built; --strip: the release profile keeps
# line tables, which the package does not need. cargo deb prints the .deb's path
# last. Its warning that ../../target/generated is not a build product is
# expected (those files are made above) and filtered out.
log=$(mktemp)
deb=$(cargo deb -p verityfs-cli --no-build --strip --locked 2>"$log" | tail -n 1) || {
    cat "$log" >&2
    exit 1
}
grep -v "Only source paths starting with exactly 'target/release/'" "$log" >&2 || true
rm -f "$log"
[ -f "$deb" ] || { echo "package.sh: cargo deb did not produce a package ($deb)" >&2; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
dpkg-deb -x "$deb" "$root"

failed=0
fail() { echo "package.sh: $*" >&2; failed=1; }

expected=(
    usr/bin/verityfs
    sbin/mount.fuse.verityfs
    usr/share/bash-completion/completions/verityfs
    usr/share/zsh/vendor-completions/_verityfs
    usr/share/fish/vendor_completions.d/verityfs.fish
    lib/systemd/system/verityfs@.service
    usr/share/doc/verityfs/README.md
    usr/share/doc/verityfs/FORMAT.md
    usr/share/doc/verityfs/SECURITY.md
    usr/share/doc/verityfs/copyright
)
# One manual page for the command and one per subcommand, as
# `verityfs --help` lists them (compressed, as Debian policy wants).
for cmd in $("$root/usr/bin/verityfs" --help | sed -n 's/^    verityfs \([a-z][a-z_-]*\).*/\1/p'); do
    expected+=("usr/share/man/man1/verityfs-$cmd.1.gz")
done
expected+=(usr/share/man/man1/verityfs.1.gz)
[ ${#expected[@]} -ge 17 ] || fail "too few subcommands found in verityfs --help"

for f in "${expected[@]}"; do
    [ -f "$root/$f" ] || fail "missing from the package: /$f"
done
for f in usr/bin/verityfs sbin/mount.fuse.verityfs; do
    [ -x "$root/$f" ] || fail "not executable: /$f"
done
"$root/usr/bin/verityfs" --version | grep -q '^verityfs v' || fail "/usr/bin/verityfs --version failed"
bash -n "$root/usr/share/bash-completion/completions/verityfs" || fail "bash completion: syntax error"
zcat "$root/usr/share/man/man1/verityfs-mount.1.gz" | grep -q 'no\\-merkle\\-readahead' ||
    fail "verityfs-mount(1) does not document --no-merkle-readahead"
grep -q '^ExecStart=/usr/bin/verityfs mount ' "$root/lib/systemd/system/verityfs@.service" ||
    fail "the systemd unit does not run /usr/bin/verityfs"
depends=$(dpkg-deb -f "$deb" Depends)
[[ $depends == *fuse3* ]] || fail "Depends lacks fuse3: $depends"

if [ $failed -ne 0 ]; then
    echo "package.sh: $deb is incomplete; its contents:" >&2
    dpkg-deb -c "$deb" >&2
    exit 1
fi
echo "package.sh: $deb OK ($(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version), Depends: $depends)"
