//! Verity files in a backing directory: enable, open, verified reads,
//! readahead counters and interrupted enables, on real files.

mod common;

use std::fs::File;

use common::{enable, expected_digest, open, open_rw, random_bytes, write_file};
use verityfs::{
    build_merkle_tree, enable_verity, DiscardTree, EnableRequest, FileState, HashAlgorithm,
    MerkleTreeParams, MetadataType, ReadOptions, Verifier,
};

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
        let data = random_bytes(size, bs);
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

/// Cancels the enable at each progress call in turn (after each chunk of
/// data, the last one included): each time the file is left as it was, and
/// a final enable still works.
#[test]
fn interrupted_enable_leaves_the_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    for (size, bs) in [(1, 4096), (10 << 20, 4096), ((5 << 20) + 5, 1024)] {
        let data = random_bytes(size, 1);
        let params = MerkleTreeParams::new(HashAlgorithm::Sha256, bs, b"").unwrap();
        let path = write_file(dir.path(), &format!("f{size}"), &data);
        let mut chunks = 0;
        let mut count = |_| {
            chunks += 1;
            Ok(())
        };
        build_merkle_tree(&params, size as u64, &data[..], DiscardTree, &mut count).unwrap();
        assert!(chunks > 0, "size {size}: no progress call to stop at");
        for stop_at in 1..=chunks {
            let mut calls = 0;
            let mut progress = |_| {
                calls += 1;
                calls < stop_at
            };
            let request = EnableRequest {
                params,
                signature: None,
                progress: &mut progress,
            };
            let err = enable_verity(&open_rw(&path), request).unwrap_err();
            assert_eq!(err.errno(), libc::EINTR);
            assert_eq!(calls, stop_at, "size {size}");
            assert!(
                std::fs::read(&path).unwrap() == data,
                "size {size}, stop at {stop_at}"
            );
            assert_eq!(
                FileState::read(&File::open(&path).unwrap()).unwrap(),
                FileState::Regular
            );
        }
        let descriptor = enable(&path, params).unwrap();
        assert_eq!(descriptor.file_digest(), expected_digest(&data, &params));
    }
}

#[test]
fn sequential_reads_with_and_without_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(64 << 20, 2);
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

/// A small file is asked for whole when opened (data, tree and descriptor
/// in one request): reading it asks for nothing more, for any read size.
#[test]
fn small_files_read_whole_ask_for_no_tree_readahead() {
    let dir = tempfile::tempdir().unwrap();
    let data = random_bytes(300_000, 4);
    let path = write_file(dir.path(), "f", &data);
    enable(&path, MerkleTreeParams::default()).unwrap();
    for read_size in [4096, 16 << 10, 128 << 10] {
        let file = open(&Verifier::new(ReadOptions::default()), &path);
        let mut buf = vec![0u8; read_size];
        for (i, chunk) in data.chunks(read_size).enumerate() {
            let n = file.read_at(&mut buf, (i * read_size) as u64).unwrap();
            assert_eq!(&buf[..n], chunk);
        }
        let s = file.stats().snapshot();
        assert_eq!(s.readahead_requests, 0, "{read_size}-byte reads: {s:?}");
    }
}

/// `read_metadata` is pread-like: an offset past the end of an item reads
/// nothing, however large, including offsets within `tree_pos` of 2^64,
/// where an unchecked `tree_pos + offset` would overflow.
#[test]
fn read_metadata_far_past_the_end_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "f", &random_bytes(100_000, 3));
    enable(&path, MerkleTreeParams::default()).unwrap();
    let file = open(&Verifier::new(ReadOptions::default()), &path);
    for kind in [MetadataType::MerkleTree, MetadataType::Descriptor] {
        for offset in [1 << 62, u64::MAX - 5, u64::MAX] {
            assert_eq!(
                file.read_metadata(kind, offset, 10).unwrap(),
                b"",
                "{kind:?}"
            );
        }
    }
}

/// Records longer than any valid one are malformed (`EINVAL`, as
/// docs/FORMAT.md says), not a buffer problem (`ERANGE`).
#[test]
fn oversized_records_are_invalid() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["user.verityfs", "user.verityfs.enabling"] {
        for len in [17, 49, 200, 4000] {
            let path = write_file(dir.path(), "f", b"data");
            let value = vec![0u8; len];
            rustix::fs::setxattr(&path, name, &value, rustix::fs::XattrFlags::empty()).unwrap();
            let file = File::open(&path).unwrap();
            let err = FileState::read(&file).unwrap_err();
            assert_eq!(err.errno(), libc::EINVAL, "{name} of {len} bytes: {err}");
            let err = FileState::read_path(&path).unwrap_err();
            assert_eq!(err.errno(), libc::EINVAL, "{name} of {len} bytes: {err}");
            std::fs::remove_file(&path).unwrap();
        }
    }
}
