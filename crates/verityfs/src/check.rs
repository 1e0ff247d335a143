//! Re-checking every data block of a verity file against its Merkle tree,
//! as `verityfs verify` does: a scrub that finds every bad block instead of
//! stopping at the first.
//!
//! The file is read in large chunks through [`VerityFile::read_at`], so the
//! fast path is the ordinary verified read path (parallel hashing, tree
//! readahead). A chunk that fails with [`Error::Corrupted`] is read again
//! block by block, which reports each bad block once, with the level whose
//! hash did not match.

use crate::error::{Corruption, Error, Result};
use crate::open::VerityFile;

/// Bytes read at once by [`check_file`] (rounded down to whole blocks, and
/// at least one block).
const CHECK_CHUNK_SIZE: usize = 4 << 20;

/// What [`check_file`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckSummary {
    /// Data blocks in the file (all of them were checked).
    pub data_blocks: u64,
    /// Data blocks that failed verification, at any level.
    pub corrupted_blocks: u64,
}

impl CheckSummary {
    /// True if no block failed.
    pub fn is_ok(&self) -> bool {
        self.corrupted_blocks == 0
    }
}

/// Checks every data block of `file`: calls `on_corruption` once for each
/// block that does not verify (in file order, with the position of the
/// block and the level whose hash mismatched), and `progress` with the
/// number of data bytes checked after each chunk (never for an empty file).
///
/// Corruption is a finding, not an error: the summary counts it. Any other
/// failure (an I/O error, metadata cut off after the file was opened) ends
/// the check and is returned.
///
/// Tree blocks a previous read verified are trusted from the verifier's
/// cache, as by every reader; for a check of what is on disk now, open the
/// file with a [`Verifier`](crate::Verifier) of its own.
pub fn check_file(
    file: &VerityFile,
    progress: &mut dyn FnMut(u64),
    on_corruption: &mut dyn FnMut(&Corruption),
) -> Result<CheckSummary> {
    check_in_chunks(file, CHECK_CHUNK_SIZE, progress, on_corruption)
}

fn check_in_chunks(
    file: &VerityFile,
    chunk_size: usize,
    progress: &mut dyn FnMut(u64),
    on_corruption: &mut dyn FnMut(&Corruption),
) -> Result<CheckSummary> {
    let size = file.data_size();
    let block_size = file.geometry().block_size();
    let chunk_size = (chunk_size / block_size).max(1) * block_size;
    let mut buf = vec![0u8; (chunk_size as u64).min(size) as usize];
    let mut summary = CheckSummary {
        data_blocks: file.geometry().data_blocks(),
        corrupted_blocks: 0,
    };
    let mut pos = 0;
    while pos < size {
        let len = (size - pos).min(chunk_size as u64) as usize;
        if read_all(file, &mut buf[..len], pos)?.is_some() {
            for (i, block) in buf[..len].chunks_mut(block_size).enumerate() {
                if let Some(corruption) = read_all(file, block, pos + (i * block_size) as u64)? {
                    summary.corrupted_blocks += 1;
                    on_corruption(&corruption);
                }
            }
        }
        pos += len as u64;
        progress(pos);
    }
    Ok(summary)
}

/// Reads all of `buf` at `pos` (inside the data): the corruption if a block
/// did not verify, an error for anything else.
fn read_all(file: &VerityFile, buf: &mut [u8], pos: u64) -> Result<Option<Box<Corruption>>> {
    match file.read_at(buf, pos) {
        Ok(n) => {
            debug_assert_eq!(n, buf.len(), "reads inside the data are never short");
            Ok(None)
        }
        Err(Error::Corrupted(corruption)) => Ok(Some(corruption)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    use super::*;
    use crate::{enable_verity, EnableRequest, HashAlgorithm, MerkleTreeParams, ReadOptions};
    use crate::{Verifier, VerityFile};

    /// 1 KiB blocks with SHA-256: 32 hashes per tree block.
    const BS: usize = 1024;

    /// Writes `size` bytes to a new file in `dir` and enables verity on it.
    fn verity_file(dir: &Path, size: usize) -> std::path::PathBuf {
        let path = dir.join(format!("f{size}"));
        let data: Vec<u8> = (0..size).map(|i| (i ^ (i >> 10)) as u8).collect();
        std::fs::write(&path, data).unwrap();
        let params = MerkleTreeParams::new(HashAlgorithm::Sha256, BS as u64, b"").unwrap();
        let request = EnableRequest {
            params,
            signature: None,
            progress: &mut |_| true,
        };
        enable_verity(&open_rw(&path), request).unwrap();
        path
    }

    fn open_rw(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    fn open(path: &Path) -> VerityFile {
        let verifier = Verifier::new(ReadOptions::default());
        VerityFile::open(&verifier, File::open(path).unwrap(), path).unwrap()
    }

    fn flip_byte(path: &Path, pos: u64) {
        let file = open_rw(path);
        let mut b = [0u8];
        file.read_exact_at(&mut b, pos).unwrap();
        file.write_all_at(&[b[0] ^ 0x10], pos).unwrap();
    }

    /// Checks `file` in chunks of `chunk` bytes: the summary, the
    /// `(pos, level)` of each report, and the progress values.
    fn check(file: &VerityFile, chunk: usize) -> (CheckSummary, Vec<(u64, i32)>, Vec<u64>) {
        let (mut found, mut done) = (Vec::new(), Vec::new());
        let summary = check_in_chunks(file, chunk, &mut |n| done.push(n), &mut |c| {
            found.push((c.pos, c.level))
        })
        .unwrap();
        (summary, found, done)
    }

    #[test]
    fn intact_files_pass_with_progress_after_each_chunk() {
        let dir = tempfile::tempdir().unwrap();
        for size in [0, 1, BS, 100 * BS + 5] {
            let file = open(&verity_file(dir.path(), size));
            // 8.5 blocks round down to 8.
            let (summary, found, done) = check(&file, 8 * BS + BS / 2);
            let blocks = size.div_ceil(BS) as u64;
            assert_eq!(
                summary,
                CheckSummary {
                    data_blocks: blocks,
                    corrupted_blocks: 0
                }
            );
            assert!(summary.is_ok() && found.is_empty());
            let want: Vec<u64> = (1..=size.div_ceil(8 * BS))
                .map(|i| (i * 8 * BS).min(size) as u64)
                .collect();
            assert_eq!(done, want, "size {size}");
            let (whole, _, _) = check(&file, CHECK_CHUNK_SIZE);
            assert_eq!(whole, summary);
        }
    }

    #[test]
    fn every_bad_block_is_reported_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let size = 100 * BS + 5; // 101 blocks; level 0 has 4 blocks, level 1 one.
        let path = verity_file(dir.path(), size);
        let location = *open(&path).location();
        // Data blocks on both sides of a chunk boundary, and the partial last one.
        for block in [0u64, 7, 8, 100] {
            flip_byte(&path, block * BS as u64 + 3);
        }
        // The level-0 tree block over data blocks 32..64 (stored after the top block).
        flip_byte(&path, location.tree_pos + 2 * BS as u64 + 40);
        for chunk in [BS, 8 * BS, CHECK_CHUNK_SIZE] {
            let (summary, found, _) = check(&open(&path), chunk);
            let mut want: Vec<(u64, i32)> = [0, 7, 8].map(|b| (b * BS as u64, -1)).to_vec();
            want.extend((32..64).map(|b| (b * BS as u64, 0)));
            want.push((100 * BS as u64, -1));
            assert_eq!(found, want, "chunk {chunk}");
            assert_eq!(summary.corrupted_blocks, want.len() as u64);
            assert_eq!(summary.data_blocks, 101);
        }
    }

    #[test]
    fn a_bad_top_block_fails_every_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = verity_file(dir.path(), 40 * BS);
        let location = *open(&path).location();
        flip_byte(&path, location.tree_pos);
        let (summary, found, _) = check(&open(&path), CHECK_CHUNK_SIZE);
        assert_eq!(summary.corrupted_blocks, 40);
        assert!(found.iter().all(|&(_, level)| level == 1), "{found:?}");
    }

    #[test]
    fn errors_other_than_corruption_are_returned() {
        let dir = tempfile::tempdir().unwrap();
        let path = verity_file(dir.path(), 40 * BS);
        let file = open(&path);
        open_rw(&path)
            .set_len(file.location().tree_pos + 10)
            .unwrap();
        let err = check_file(&file, &mut |_| {}, &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::MetadataTruncated), "{err:?}");
        assert_eq!(err.errno(), libc::EIO);
    }
}
