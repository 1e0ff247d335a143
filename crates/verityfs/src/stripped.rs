//! Verity backing files that lost their extended attributes.
//!
//! A copy made without extended attributes (`cp` without `-a`, `tar`
//! without `--xattrs`, `rsync` without `-X`) drops the location record, so
//! the copy reads as an ordinary file: the data with the Merkle tree and
//! descriptor glued to its end. The metadata is still recognisable: the
//! file ends with a descriptor (and its signature) at exactly the position
//! the layout gives it for the descriptor's data size, and the first tree
//! block (or the only data block) hashes to the descriptor's root hash.
//! [`find_stripped`] finds it and [`reattach`] writes the location record
//! back, which makes the file verity again with its original digest.

use std::fs::File;
use std::os::unix::fs::FileExt;

use rustix::fs::{fsetxattr, XattrFlags};

use crate::descriptor::{Descriptor, DESCRIPTOR_SIZE, MAX_DESCRIPTOR_SIZE};
use crate::error::{Error, Result};
use crate::geometry::TreeGeometry;
use crate::layout::{Location, LOCATION_XATTR};
use crate::state::FileState;

/// The location of the metadata at the end of `file`, an ordinary file
/// (no location record) that is a verity backing file stripped of its
/// extended attributes; `None` if it does not end that way.
///
/// Reads the last 16 KiB and one tree (or data) block.
pub fn find_stripped(file: &File) -> Result<Option<Location>> {
    let len = file.metadata()?.len();
    let tail_len = len.min(MAX_DESCRIPTOR_SIZE as u64) as usize;
    if tail_len < DESCRIPTOR_SIZE {
        return Ok(None);
    }
    let mut tail = vec![0u8; tail_len];
    file.read_exact_at(&mut tail, len - tail_len as u64)?;
    for start in (0..=tail_len - DESCRIPTOR_SIZE).rev() {
        let stored = &tail[start..];
        let sig_size = u32::from_le_bytes(stored[4..8].try_into().expect("4 bytes"));
        if stored[0] != 1 || sig_size as usize != stored.len() - DESCRIPTOR_SIZE {
            continue;
        }
        let desc_pos = len - stored.len() as u64;
        if let Some(location) = check_candidate(file, stored, desc_pos, len)? {
            return Ok(Some(location));
        }
    }
    Ok(None)
}

/// The location if `stored` (the bytes from `desc_pos` to the end, `len`)
/// is the descriptor of the data before it.
fn check_candidate(
    file: &File,
    stored: &[u8],
    desc_pos: u64,
    len: u64,
) -> Result<Option<Location>> {
    let Ok((descriptor, _)) = Descriptor::parse(stored) else {
        return Ok(None);
    };
    let params = descriptor.params();
    if params.check_kernel_limits().is_err() {
        return Ok(None);
    }
    let geometry = TreeGeometry::new(params, descriptor.data_size());
    let Ok(location) = Location::new(
        descriptor.data_size(),
        geometry.tree_size(),
        stored.len() as u32,
    ) else {
        return Ok(None);
    };
    if location.desc_pos != desc_pos || location.end() != Some(len) {
        return Ok(None);
    }
    Ok(root_matches(file, &descriptor, &location)?.then_some(location))
}

/// Whether the top tree block (the only data block, for files of at most
/// one block) hashes to the root hash.
fn root_matches(file: &File, descriptor: &Descriptor, location: &Location) -> Result<bool> {
    let params = descriptor.params();
    if location.data_size == 0 {
        return Ok(descriptor.root_hash().as_bytes().iter().all(|&b| b == 0));
    }
    let (pos, len) = match location.tree_size {
        0 => (0, location.data_size as usize),
        _ => (location.tree_pos, params.block_size()),
    };
    let mut block = vec![0u8; params.block_size()];
    file.read_exact_at(&mut block[..len], pos)?;
    Ok(params.hasher().hash_block(&block) == *descriptor.root_hash())
}

/// Makes a stripped backing file (see [`find_stripped`]) a verity file
/// again by writing its location record. Errors: `EEXIST` if it already is
/// one, `ENODATA` if its end is not verity metadata, `EINVAL` for an
/// interrupted enable (which has a record, so was not stripped).
pub fn reattach(file: &File) -> Result<Location> {
    match FileState::read(file)? {
        FileState::Regular => {}
        FileState::Verity(_) => return Err(Error::AlreadyVerity),
        FileState::Enabling(_) => return Err(Error::InvalidArgument("an enable was interrupted")),
    }
    let location = find_stripped(file)?.ok_or(Error::NotVerity)?;
    match fsetxattr(file, LOCATION_XATTR, &location.encode(), XattrFlags::CREATE) {
        Err(rustix::io::Errno::EXIST) => return Err(Error::AlreadyVerity),
        other => other.map_err(std::io::Error::from)?,
    }
    file.sync_all()?;
    Ok(location)
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::path::Path;

    use super::*;
    use crate::{enable_verity, EnableRequest, HashAlgorithm, MerkleTreeParams};
    use crate::{ReadOptions, Verifier, VerityFile};

    /// A verity file of `size` bytes, then its copy without xattrs.
    fn stripped_copy(dir: &Path, size: usize, params: MerkleTreeParams, sig: &[u8]) -> File {
        let path = dir.join(format!("f{size}-{}", sig.len()));
        let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let request = EnableRequest {
            params,
            signature: (!sig.is_empty()).then_some(sig),
            progress: &mut |_| true,
        };
        enable_verity(&rw, request).unwrap();
        let copy = dir.join(format!("copy{size}-{}", sig.len()));
        std::fs::copy(&path, &copy).unwrap();
        let _ = rustix::fs::removexattr(&copy, LOCATION_XATTR);
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(copy)
            .unwrap()
    }

    #[test]
    fn stripped_copies_are_found_and_reattached() {
        let dir = tempfile::tempdir().unwrap();
        let p1k = MerkleTreeParams::new(HashAlgorithm::Sha512, 1024, b"salt").unwrap();
        for (size, params, sig) in [
            (0, MerkleTreeParams::default(), &b""[..]),
            (100, MerkleTreeParams::default(), &b""[..]),
            (4096, MerkleTreeParams::default(), &b"a signature"[..]),
            (1_000_000, MerkleTreeParams::default(), &b""[..]),
            (300_000, p1k, &[9u8; 5000][..]),
        ] {
            let file = stripped_copy(dir.path(), size, params, sig);
            assert_eq!(FileState::read(&file).unwrap(), FileState::Regular);
            let found = find_stripped(&file).unwrap().expect("found");
            assert_eq!(found.data_size, size as u64);
            assert_eq!(reattach(&file).unwrap(), found);
            let verifier = Verifier::new(ReadOptions::default());
            let verity = VerityFile::open(&verifier, file.try_clone().unwrap(), "f".as_ref());
            assert_eq!(verity.unwrap().signature(), sig);
            assert_eq!(reattach(&file).unwrap_err().errno(), libc::EEXIST);
        }
    }

    #[test]
    fn ordinary_and_damaged_files_are_not_taken_for_stripped_ones() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, vec![1u8; 70_000]).unwrap();
        let plain = OpenOptions::new()
            .read(true)
            .write(true)
            .open(plain)
            .unwrap();
        assert_eq!(find_stripped(&plain).unwrap(), None);
        assert_eq!(reattach(&plain).unwrap_err().errno(), libc::ENODATA);

        // One more byte at the end, or a changed top tree block: not ours.
        let file = stripped_copy(dir.path(), 200_000, MerkleTreeParams::default(), b"");
        let len = file.metadata().unwrap().len();
        file.set_len(len + 1).unwrap();
        assert_eq!(find_stripped(&file).unwrap(), None);
        file.set_len(len).unwrap();
        let tree_pos = 200_000u64.next_multiple_of(65536);
        file.write_all_at(b"X", tree_pos + 5).unwrap();
        assert_eq!(find_stripped(&file).unwrap(), None);
    }
}
