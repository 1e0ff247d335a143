//! Where a verity file's metadata lives in its backing file (see
//! `docs/FORMAT.md`).
//!
//! As on ext4 and f2fs, the data stays at the start of the backing file, the
//! Merkle tree follows at the next 64 KiB boundary past the data, and the
//! descriptor (with any signature) follows the tree. A small location record
//! in the extended attribute [`LOCATION_XATTR`] marks the file as verity and
//! says where everything is; it is written last, in one `setxattr`, which is
//! what makes enabling atomic. While an enable is under way, the record
//! [`ENABLING_XATTR`] holds the original size, so that a crash can be undone.

use crate::descriptor::{DESCRIPTOR_SIZE, MAX_DESCRIPTOR_SIZE};
use crate::error::{Error, Result};

/// Extended attribute holding the [`Location`] of a verity file's metadata.
pub const LOCATION_XATTR: &str = "user.verityfs";

/// Extended attribute present while verity is being enabled
/// ([`EnablingRecord`]).
pub const ENABLING_XATTR: &str = "user.verityfs.enabling";

/// Every extended attribute of the layout starts with this; a filesystem
/// built on the layout hides them from its users.
pub const XATTR_PREFIX: &str = "user.verityfs";

/// The Merkle tree starts at a multiple of this past the data, as on ext4
/// and f2fs (it keeps 64 KiB-page systems working and leaves a hole, not
/// wasted space, on most filesystems).
pub const TREE_ALIGNMENT: u64 = 65536;

const LOCATION_MAGIC: [u8; 4] = *b"VFSV";
const ENABLING_MAGIC: [u8; 4] = *b"VFSE";
const LAYOUT_VERSION: u8 = 1;

/// Size of an encoded [`Location`].
pub const LOCATION_SIZE: usize = 48;

/// Size of an encoded [`EnablingRecord`].
pub const ENABLING_SIZE: usize = 16;

/// Where the metadata of a verity file lies in its backing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// The file's size as seen by readers (its data).
    pub data_size: u64,
    /// Byte position of the Merkle tree.
    pub tree_pos: u64,
    /// Size of the Merkle tree in bytes.
    pub tree_size: u64,
    /// Byte position of the descriptor.
    pub desc_pos: u64,
    /// Size of the stored descriptor: 256 bytes plus the signature.
    pub desc_size: u32,
}

impl Location {
    /// The location of the metadata of a file of `data_size` bytes with a
    /// tree of `tree_size` bytes and a stored descriptor of `desc_size`
    /// bytes; `EFBIG` if it would not fit in a file.
    pub fn new(data_size: u64, tree_size: u64, desc_size: u32) -> Result<Self> {
        let too_big = || Error::FileTooLarge(data_size);
        let tree_pos = data_size
            .checked_next_multiple_of(TREE_ALIGNMENT)
            .ok_or_else(too_big)?;
        let desc_pos = tree_pos.checked_add(tree_size).ok_or_else(too_big)?;
        let location = Location {
            data_size,
            tree_pos,
            tree_size,
            desc_pos,
            desc_size,
        };
        if location
            .end()
            .filter(|&end| end <= i64::MAX as u64)
            .is_none()
        {
            return Err(too_big());
        }
        Ok(location)
    }

    /// The size of the backing file: the end of the descriptor.
    pub fn end(&self) -> Option<u64> {
        self.desc_pos.checked_add(self.desc_size.into())
    }

    /// The record as stored in [`LOCATION_XATTR`] (little endian).
    pub fn encode(&self) -> [u8; LOCATION_SIZE] {
        let mut b = [0u8; LOCATION_SIZE];
        b[..4].copy_from_slice(&LOCATION_MAGIC);
        b[4] = LAYOUT_VERSION;
        b[8..16].copy_from_slice(&self.data_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.tree_pos.to_le_bytes());
        b[24..32].copy_from_slice(&self.tree_size.to_le_bytes());
        b[32..40].copy_from_slice(&self.desc_pos.to_le_bytes());
        b[40..44].copy_from_slice(&self.desc_size.to_le_bytes());
        b
    }

    /// Parses and checks a stored record: magic, version, reserved bytes,
    /// and that every position follows from the data size as
    /// [`Location::new`] computes it.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = Error::InvalidLocation;
        let b: &[u8; LOCATION_SIZE] = b.try_into().map_err(|_| bad("wrong size"))?;
        if b[..4] != LOCATION_MAGIC {
            return Err(bad("bad magic"));
        }
        if b[4] != LAYOUT_VERSION {
            return Err(bad("unsupported layout version"));
        }
        if b[5..8] != [0; 3] || b[44..] != [0; 4] {
            return Err(bad("reserved bytes set"));
        }
        let desc_size = le32(&b[40..44]);
        if !(DESCRIPTOR_SIZE as u32..=MAX_DESCRIPTOR_SIZE as u32).contains(&desc_size) {
            return Err(bad("descriptor size out of range"));
        }
        let location = Location::new(le64(&b[8..16]), le64(&b[24..32]), desc_size)
            .map_err(|_| bad("positions overflow"))?;
        if location.encode() != *b {
            return Err(bad("positions do not follow the data size"));
        }
        Ok(location)
    }
}

/// The record present while an enable is under way: the size the file had
/// before its tree was appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnablingRecord {
    /// The file's size before the enable started.
    pub data_size: u64,
}

impl EnablingRecord {
    /// The record as stored in [`ENABLING_XATTR`].
    pub fn encode(&self) -> [u8; ENABLING_SIZE] {
        let mut b = [0u8; ENABLING_SIZE];
        b[..4].copy_from_slice(&ENABLING_MAGIC);
        b[4] = LAYOUT_VERSION;
        b[8..].copy_from_slice(&self.data_size.to_le_bytes());
        b
    }

    /// Parses a stored record.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = Error::InvalidLocation;
        let b: &[u8; ENABLING_SIZE] = b
            .try_into()
            .map_err(|_| bad("wrong enabling record size"))?;
        if b[..4] != ENABLING_MAGIC || b[4] != LAYOUT_VERSION || b[5..8] != [0; 3] {
            return Err(bad("bad enabling record"));
        }
        Ok(EnablingRecord {
            data_size: le64(&b[8..]),
        })
    }
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ext4_worked_example_positions() {
        // 1,000,000 bytes, 4K/SHA-256: 12288-byte tree at 1 MiB.
        let l = Location::new(1_000_000, 12288, 256).unwrap();
        assert_eq!(
            (l.tree_pos, l.desc_pos, l.end()),
            (1_048_576, 1_060_864, Some(1_061_120))
        );
        assert_eq!(Location::new(0, 0, 256).unwrap().tree_pos, 0);
        assert_eq!(Location::new(65536, 0, 256).unwrap().tree_pos, 65536);
        assert_eq!(
            Location::new(u64::MAX - 5, 0, 256).unwrap_err().errno(),
            libc::EFBIG
        );
    }

    #[test]
    fn decode_rejects_every_inconsistency() {
        let good = Location::new(1_000_000, 12288, 300).unwrap().encode();
        assert!(Location::decode(&good).is_ok());
        for (i, v) in [
            (0, b'X'),
            (4, 2),
            (5, 1),
            (45, 1),
            (16, 1),
            (32, 1),
            (41, 0x40),
        ] {
            let mut b = good;
            b[i] ^= v;
            assert_eq!(
                Location::decode(&b).unwrap_err().errno(),
                libc::EINVAL,
                "byte {i}"
            );
        }
        assert!(Location::decode(&good[..47]).is_err());
    }

    proptest! {
        #[test]
        fn location_round_trips(data in 0u64..1 << 50, tree in 0u64..1 << 40, sig in 0u32..16128) {
            let l = Location::new(data, tree, 256 + sig).unwrap();
            prop_assert_eq!(Location::decode(&l.encode()).unwrap(), l);
            prop_assert!(l.tree_pos >= data && l.tree_pos % TREE_ALIGNMENT == 0);
        }

        /// Arbitrary bytes, and valid records with one bit flipped: decoding
        /// never panics, and whatever decodes is the one record encoded as
        /// exactly those bytes.
        #[test]
        fn decode_accepts_only_canonical_records(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            data in 0u64..1 << 50,
            tree in 0u64..1 << 40,
            flip in 0usize..LOCATION_SIZE * 8,
        ) {
            let mut location = Location::new(data, tree, 256).unwrap().encode();
            location[flip / 8] ^= 1 << (flip % 8);
            let mut enabling = EnablingRecord { data_size: data }.encode();
            enabling[flip / 8 % ENABLING_SIZE] ^= 1 << (flip % 8);
            for b in [&bytes[..], &location[..], &enabling[..]] {
                if let Ok(l) = Location::decode(b) {
                    prop_assert_eq!(&l.encode()[..], b);
                }
                if let Ok(r) = EnablingRecord::decode(b) {
                    prop_assert_eq!(&r.encode()[..], b);
                }
            }
        }
    }

    #[test]
    fn enabling_record_round_trips() {
        let r = EnablingRecord {
            data_size: 123456789,
        };
        assert_eq!(EnablingRecord::decode(&r.encode()).unwrap(), r);
        assert!(EnablingRecord::decode(&[0; 16]).is_err());
    }
}
