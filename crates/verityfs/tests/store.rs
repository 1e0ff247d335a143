//! Verity files in a backing directory: enable, open, verified reads,
//! readahead counters and interrupted enables, on real files.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use verityfs::{
    build_merkle_tree, enable_verity, DiscardTree, EnableRequest, FileState, HashAlgorithm,
    MerkleTreeParams, ReadOptions, Verifier, VerityFile,
};

fn pattern(size: usize, seed: u32) -> Vec<u8> {
    (0..size as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn write_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let path = dir.join(name);
    File::create(&path).unwrap().write_all(data).unwrap();
    path
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

fn enable(path: &Path, params: MerkleTreeParams) -> verityfs::Result<verityfs::Descriptor> {
    let request = EnableRequest {
        params,
        signature: None,
        progress: &mut |_| true,
    };
    enable_verity(&open_rw(path), request)
}

fn open(verifier: &Arc<Verifier>, path: &Path) -> VerityFile {
    VerityFile::open(verifier, File::open(path).unwrap(), path).unwrap()
}

fn expected_digest(data: &[u8], params: &MerkleTreeParams) -> verityfs::Digest {
    let (d, _) = build_merkle_tree(
        params,
        data.len() as u64,
        data,
        DiscardTree,
        &mut |_| Ok(()),
    )
    .unwrap();
    d.file_digest()
}

#[test]
fn enable_then_read_everything_back() {
    let dir = tempfile::tempdir().unwrap();
    let verifier = Verifier::new(ReadOptions::default());
    for (size, bs, alg) in [
        (0, 4096, HashAlgorithm::Sha256),
        (1, 4096, HashAlgorithm::Sha256),
        (4096, 1024, HashAlgorithm::Sha512),
        (100_000, 1024, HashAlgorithm::Sha256),
        (3_000_001, 4096, HashAlgorithm::Sha512),
        (5_000_000, 65536, HashAlgorithm::Sha256),
    ] {
        let data = pattern(size, bs as u32);
        let params = MerkleTreeParams::new(alg, bs, b"salt").unwrap();
        let path = write_file(dir.path(), &format!("f{size}-{bs}"), &data);
        let descriptor = enable(&path, params).unwrap();
        assert_eq!(descriptor.file_digest(), expected_digest(&data, &params));
        let file = open(&verifier, &path);
        assert_eq!(file.digest(), &descriptor.file_digest());
        assert_eq!(file.data_size(), size as u64);
        // Whole file, then odd-sized unaligned pieces.
        let mut buf = vec![0u8; size + 10];
        assert_eq!(file.read_at(&mut buf, 0).unwrap(), size);
        assert_eq!(&buf[..size], &data[..]);
        for (offset, len) in [(1, 7), (1000, 5000), (size.saturating_sub(3), 100)] {
            let mut piece = vec![0u8; len];
            let n = file.read_at(&mut piece, offset as u64).unwrap();
            let want = &data[offset.min(size)..(offset + len).min(size)];
            assert_eq!(&piece[..n], want, "size {size} offset {offset}");
        }
        assert_eq!(file.read_at(&mut buf, size as u64).unwrap(), 0);
        // Enabling twice is EEXIST.
        assert_eq!(enable(&path, params).unwrap_err().errno(), libc::EEXIST);
    }
}

#[test]
fn interrupted_enable_leaves_the_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(10 << 20, 1);
    let path = write_file(dir.path(), "f", &data);
    for stop_after in 1..5 {
        let mut calls = 0;
        let mut progress = |_| {
            calls += 1;
            calls < stop_after
        };
        let request = EnableRequest {
            params: MerkleTreeParams::default(),
            signature: None,
            progress: &mut progress,
        };
        let err = enable_verity(&open_rw(&path), request).unwrap_err();
        assert_eq!(err.errno(), libc::EINTR);
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(
            FileState::read(&File::open(&path).unwrap()).unwrap(),
            FileState::Regular
        );
    }
    enable(&path, MerkleTreeParams::default()).unwrap();
}

#[test]
fn sequential_reads_with_and_without_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 << 20, 2);
    let path = write_file(dir.path(), "f", &data);
    enable(&path, MerkleTreeParams::default()).unwrap();
    let level0_blocks = (64 << 20) / 4096 / 128;
    for readahead in [false, true] {
        let verifier = Verifier::new(ReadOptions {
            merkle_readahead: readahead,
            ..Default::default()
        });
        let file = open(&verifier, &path);
        let mut buf = vec![0u8; 128 << 10];
        for (i, chunk) in data.chunks(128 << 10).enumerate() {
            let n = file.read_at(&mut buf, (i * (128 << 10)) as u64).unwrap();
            assert_eq!(&buf[..n], chunk);
        }
        let s = file.stats().snapshot();
        assert_eq!(s.data_blocks_verified, (64 << 20) / 4096);
        assert_eq!(s.verification_failures, 0);
        if readahead {
            // 128 KiB reads: 8 level-0 blocks fetched per request.
            assert!(s.tree_read_requests <= level0_blocks / 8 + 2, "{s:?}");
            assert!(s.readahead_requests > 0, "{s:?}");
        } else {
            // One request per tree block: 128 level-0 blocks and the top one.
            assert_eq!(s.tree_read_requests, level0_blocks + 1, "{s:?}");
            assert_eq!(s.tree_blocks_read, level0_blocks + 1, "{s:?}");
        }
        // Each tree block is read once: every other lookup hits the cache.
        assert_eq!(s.tree_blocks_read, level0_blocks + 1, "{s:?}");
    }
}
