//! Reading a verity file's metadata as `FS_IOC_READ_VERITY_METADATA` gives
//! it (kernel: `fs/verity/read_metadata.c`). Like the kernel, the bytes are
//! returned as stored, not re-authenticated.

use crate::error::{Error, Result};
use crate::open::VerityFile;

/// Which metadata to read (`FS_VERITY_METADATA_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetadataType {
    /// The Merkle tree, top level first (1).
    MerkleTree,
    /// The 256-byte descriptor with `sig_size` 0 (2).
    Descriptor,
    /// The built-in signature (3); `ENODATA` if there is none.
    Signature,
}

impl VerityFile {
    /// Up to `len` bytes of the metadata item `kind` from `offset`, like
    /// `pread`: short at the end, empty past it.
    pub fn read_metadata(&self, kind: MetadataType, offset: u64, len: usize) -> Result<Vec<u8>> {
        let descriptor;
        let item: &[u8] = match kind {
            MetadataType::MerkleTree => return self.read_tree_bytes(offset, len),
            MetadataType::Descriptor => {
                descriptor = self.descriptor.to_unsigned_bytes();
                &descriptor
            }
            MetadataType::Signature if self.signature.is_empty() => return Err(Error::NoSignature),
            MetadataType::Signature => &self.signature,
        };
        let start = offset.min(item.len() as u64) as usize;
        Ok(item[start..][..len.min(item.len() - start)].to_vec())
    }

    fn read_tree_bytes(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let tree_size = self.location.tree_size;
        if offset >= tree_size {
            return Ok(Vec::new());
        }
        let len = (len as u64).min(tree_size - offset) as usize;
        let mut buf = vec![0u8; len];
        let pos = self.location.tree_pos + offset;
        self.tree.read_exact_at(&mut buf, pos)?;
        Ok(buf)
    }
}
