//! Where a small verity file's blocks lie on an ext4 disk once enabled:
//! its data, Merkle tree and descriptor one after the other (the physical
//! extents `filefrag -v` lists follow each other), so that reading it whole
//! when it is opened is one device request, as for a plain file. Checked
//! for files enabled through a mount (written just before, and written and
//! flushed to the disk earlier) and with `verityfs enable-offline`.
//!
//! The backing directories are on a fresh ext4 filesystem on a loop device
//! of the test's own.

mod common;
#[path = "../../verityfs/tests/common/ext4.rs"]
mod ext4;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{enable, random_bytes, run_ok, Mount, VERITYFS};
use ext4::ext4_dir;

/// Files per case, written in turn with plain files of the same size (as
/// `verityfs bench` does), so that other files' blocks follow each file's.
const FILES: usize = 8;
/// Data sizes: a block, the benchmark's small file, unaligned sizes, and
/// the largest file read whole at open.
const SIZES: [usize; 4] = [4096, 16384, 100_001, 900_000];

/// The extents of `path` from `filefrag -v`: (logical block, physical
/// block, length in blocks).
fn extents(path: &Path) -> Vec<(u64, u64, u64)> {
    let out = run_ok(Command::new("filefrag").arg("-v").arg(path));
    out.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').map(str::trim).collect();
            if fields.len() < 4 || fields[0].parse::<u64>().is_err() {
                return None;
            }
            let start = |range: &str| range.split("..").next()?.trim().parse().ok();
            Some((
                start(fields[1])?,
                start(fields[2])?,
                fields[3].parse().ok()?,
            ))
        })
        .collect()
}

/// Asserts that the blocks of the backing file `path` are contiguous on the
/// disk.
#[track_caller]
fn assert_together(path: &Path) {
    let extents = extents(path);
    assert!(!extents.is_empty(), "no extents listed for {path:?}");
    let apart = extents
        .windows(2)
        .any(|pair| pair[0].1 + pair[0].2 != pair[1].1);
    assert!(
        !apart,
        "{path:?}: data and metadata apart on the disk: extents (logical, physical, length) {extents:?}"
    );
}

/// Writes `FILES` pairs of files of each size through `dir`: `NAME.plain`
/// and `NAME`, with the same bytes.
fn write_pairs(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, size) in SIZES.iter().enumerate() {
        for j in 0..FILES {
            let name = format!("{prefix}-{size}-{j}");
            let data = random_bytes(*size, (i * FILES + j) as u64);
            fs::write(dir.join(format!("{name}.plain")), &data).unwrap();
            fs::write(dir.join(&name), &data).unwrap();
            names.push(name);
        }
    }
    names
}

#[test]
fn files_enabled_through_a_mount_lie_together() {
    let dir = ext4_dir();
    let mount = Mount::of_backing(dir.path(), &[]);
    // Written just before the enable: the data is not on the disk yet.
    let fresh = write_pairs(&mount.mnt, "fresh");
    for name in &fresh {
        enable(&mount.path(name), &[]);
    }
    // Written, then flushed to the disk before the enable.
    let old = write_pairs(&mount.mnt, "old");
    rustix::fs::sync();
    for name in &old {
        enable(&mount.path(name), &[]);
    }
    for name in fresh.iter().chain(&old) {
        assert_together(&mount.backing(name));
        let data = fs::read(mount.path(&format!("{name}.plain"))).unwrap();
        assert_eq!(fs::read(mount.path(name)).unwrap(), data, "{name}");
    }
}

#[test]
fn files_enabled_offline_lie_together() {
    let dir = ext4_dir();
    let names = write_pairs(dir.path(), "offline");
    for name in &names {
        run_ok(
            Command::new(VERITYFS)
                .arg("enable-offline")
                .arg(dir.path().join(name)),
        );
    }
    for name in &names {
        assert_together(&dir.path().join(name));
    }
}
