//! `verityfs dump_metadata`: write a verity file's Merkle tree, descriptor
//! or built-in signature to stdout, as `fsverity dump_metadata` does
//! (fsverity-utils `programs/cmd_dump_metadata.c`), but from the backing
//! file of the verityfs layout instead of `FS_IOC_READ_VERITY_METADATA`
//! (which cannot pass through FUSE): the file named, or for a path through
//! a `verityfs mount`, its backing file ([`crate::locate`]). Messages, exit codes and the
//! ioctl's rules (`ENODATA`, `EINVAL` on `offset + length` overflow, length
//! clamped to `INT_MAX`) are those of fsverity and the kernel.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;

use verityfs::{Error as LibError, MetadataType, ReadOptions, Verifier, VerityFile};

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::{print_stdout, quote};
use crate::tree_params::{number, once};

/// The values of the TYPE operand and the items they name.
pub const METADATA_TYPES: [(&str, MetadataType); 3] = [
    ("merkle_tree", MetadataType::MerkleTree),
    ("descriptor", MetadataType::Descriptor),
    ("signature", MetadataType::Signature),
];

/// Bytes asked for per read when no `--length` is given (fsverity's).
const DEFAULT_LENGTH: u64 = 32768;

/// Everything the options of `dump_metadata` ask for.
#[derive(Default)]
pub struct DumpArgs {
    offset: Option<u64>,
    length: Option<u64>,
}

impl Args for DumpArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        Opt::<Self>::value(
            "offset",
            "OFFSET",
            "Byte offset in the item to start at; needs --length",
            |a, v| {
                once(&a.offset, "--offset")?;
                a.offset = Some(number(&v, "--offset")?);
                Ok(())
            },
        ),
        Opt::<Self>::value(
            "length",
            "LENGTH",
            "Bytes to dump from the item (one read); needs --offset",
            |a, v| {
                once(&a.length, "--length")?;
                a.length = Some(number(&v, "--length")?);
                Ok(())
            },
        ),
    ];
    const OPERANDS: &'static [Operand] = &[
        Operand::one(
            "TYPE",
            "The metadata item to write to standard output",
            Hint::Values(metadata_type_names),
        ),
        Operand::one("FILE", "A verity file", Hint::File),
    ];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [kind, name] = exactly(operands)?;
        let kind = parse_metadata_type(&kind)?;
        let range = match (self.offset, self.length) {
            (None, Some(_)) => return Err(Error::usage_msg("--length specified without --offset")),
            (Some(_), None) => return Err(Error::usage_msg("--offset specified without --length")),
            (offset, length) => offset.zip(length),
        };
        dump(kind, &name, range)
    }
}

/// The names TYPE may take.
fn metadata_type_names() -> Vec<&'static str> {
    METADATA_TYPES.iter().map(|&(n, _)| n).collect()
}

fn parse_metadata_type(name: &OsStr) -> Result<MetadataType> {
    let found = METADATA_TYPES
        .iter()
        .find(|(n, _)| name.as_encoded_bytes() == n.as_bytes());
    let expected = "\n       Expected \"merkle_tree\", \"descriptor\", or \"signature\"";
    found
        .map(|&(_, kind)| kind)
        .ok_or_else(|| Error::usage_msg(quote("unknown metadata type: ", name, expected)))
}

/// Writes the item to stdout: the single read of `range` (which may be
/// short), or everything in 32768-byte reads.
fn dump(kind: MetadataType, name: &OsStr, range: Option<(u64, u64)>) -> Result<()> {
    let file = crate::locate::open(Path::new(name))
        .map_err(|e| Error::io(quote("can't open '", name, "' for reading"), &e))?
        .file;
    let failed = |e: LibError| {
        let msg = quote("FS_IOC_READ_VERITY_METADATA failed on '", name, "'");
        Error::io(msg, &io::Error::from_raw_os_error(e.errno()))
    };
    let verifier = Verifier::new(ReadOptions::default());
    let file = VerityFile::open(&verifier, file, Path::new(name)).map_err(failed)?;
    let (mut offset, length) = range.unwrap_or((0, DEFAULT_LENGTH));
    if offset.checked_add(length).is_none() {
        return Err(failed(LibError::InvalidArgument(
            "offset + length overflows",
        )));
    }
    let length = length.min(i32::MAX as u64) as usize;
    loop {
        // No item comes near i64::MAX bytes, so a larger offset reads
        // nothing either; clamping keeps the library's `tree_pos + offset`
        // from overflowing.
        let bytes = file
            .read_metadata(kind, offset.min(i64::MAX as u64), length)
            .map_err(failed)?;
        if bytes.is_empty() {
            return Ok(());
        }
        print_stdout(&bytes);
        offset += bytes.len() as u64;
        if range.is_some() {
            return Ok(());
        }
    }
}
