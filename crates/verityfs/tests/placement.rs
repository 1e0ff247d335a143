//! `place_together` on ext4: a small verity file keeps every byte, its
//! digest and its times when its blocks are moved; files it does not apply
//! to are left alone. (Where the blocks end up is checked end to end, with
//! `filefrag`, by the command line tool's `placement` test.)
//!
//! Runs on a fresh ext4 filesystem on a loop device of its own (as root).

mod common;
#[path = "common/ext4.rs"]
mod ext4;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use common::{enable, open, open_rw, random_bytes, write_file};
use ext4::ext4_dir;
use verityfs::{place_together, MerkleTreeParams, ReadOptions, Verifier};

/// Reads the verity file at `path` whole through the library.
fn read_verified(verifier: &Arc<Verifier>, path: &Path) -> Vec<u8> {
    let file = open(verifier, path);
    let mut data = vec![0; file.data_size() as usize];
    let mut done = 0;
    while done < data.len() {
        done += file.read_at(&mut data[done..], done as u64).unwrap();
    }
    data
}

#[test]
fn small_files_keep_their_bytes_digest_and_times() {
    let dir = ext4_dir();
    let verifier = Arc::new(Verifier::new(ReadOptions::default()));
    let params = || MerkleTreeParams::default();
    // Empty, one byte, one block, unaligned, and data up to the largest
    // read whole at open.
    for (i, size) in [0, 1, 4096, 16384, 100_001, 900_000]
        .into_iter()
        .enumerate()
    {
        let data = random_bytes(size, i as u64);
        let path = write_file(dir.path(), &format!("{size}"), &data);
        let descriptor = enable(&path, params()).unwrap();
        let before = std::fs::metadata(&path).unwrap();
        let stored = std::fs::read(&path).unwrap();

        let moved = place_together(&open_rw(&path), File::open(dir.path()).unwrap())
            .unwrap_or_else(|e| panic!("{size}: {e}"));
        assert!(moved, "{size}-byte file not moved");

        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), stored, "{size}-byte file");
        assert_eq!(
            (after.modified().unwrap(), after.len()),
            (before.modified().unwrap(), before.len())
        );
        assert_eq!(read_verified(&verifier, &path), data);
        let file = open(&verifier, &path);
        assert_eq!(*file.digest(), descriptor.file_digest());
    }
}

#[test]
fn large_and_plain_files_stay_where_they_are() {
    let dir = ext4_dir();
    let scratch = || File::open(dir.path()).unwrap();
    let plain = write_file(dir.path(), "plain", &random_bytes(16384, 1));
    assert!(!place_together(&open_rw(&plain), scratch()).unwrap());
    // Not read whole at open: data, gap, tree and descriptor past 1 MiB.
    let large = write_file(dir.path(), "large", &random_bytes(1 << 20, 2));
    enable(&large, MerkleTreeParams::default()).unwrap();
    assert!(!place_together(&open_rw(&large), scratch()).unwrap());
}
