//! Power cuts during enables and fsynced writes, under a real kernel.
//!
//! Killing the daemon keeps the page cache, so only a power cut shows
//! whether enable's fsyncs are where they must be. Each cut boots Linux
//! under QEMU (`scripts/kernel-oracle.sh`) with an ext4 disk image, mounts
//! verityfs on it inside the VM, writes and fsyncs files through the mount
//! and enables them with the real `fsverity`, while a log file is appended
//! to and fsynced; QEMU is killed with SIGKILL at a random moment. The next
//! boot lets ext4 replay its journal, runs `e2fsck -n`, and checks through a
//! new mount that every file is either fully verity (the digest `fsverity
//! digest` gave on the host, every byte readable) or not verity with its
//! original data and nothing left of the enable; that every acknowledged
//! enable is verity; and that nothing acknowledged by fsync is lost.
//!
//! `VERITYFS_POWER_CUTS` sets the number of cuts (default 3),
//! `VERITYFS_POWER_CUT_SEED` the seed of the plans and cut times,
//! `VERITYFS_POWER_CUT_BIN` the `verityfs` program to test (default: the
//! one cargo built).
//!
//! The same binary runs inside the VM (the role is set by
//! `VERITYFS_POWER_CUT_ROLE`), hence no test harness.

#[path = "../common/mod.rs"]
mod common;
mod guest;
mod host;
mod plan;

use std::path::PathBuf;

fn main() {
    if std::env::var_os("VERITYFS_POWER_CUT_ROLE").is_some_and(|r| r == "guest") {
        let var =
            |name| PathBuf::from(std::env::var_os(name).unwrap_or_else(|| panic!("{name} unset")));
        guest::run(&var("VERITYFS_ORACLE_IO"), &var("VERITYFS_POWER_CUT_BIN"));
    } else {
        host::run();
    }
}
