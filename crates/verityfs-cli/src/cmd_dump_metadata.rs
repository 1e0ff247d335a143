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

use verityfs::{Error, MetadataType, ReadOptions, Verifier, VerityFile};

use crate::commands::{usage_unless, Command, EXIT_FAILURE, EXIT_OK};
use crate::getopt::LongOpt;
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};
use crate::tree_params::parse_u64;

const OPT_OFFSET: u32 = 1;
const OPT_LENGTH: u32 = 2;

/// The options of `dump_metadata`.
pub const LONGOPTS: &[LongOpt] = &[
    LongOpt::required("offset", OPT_OFFSET)
        .with_help("Byte offset in the item to start at; needs --length"),
    LongOpt::required("length", OPT_LENGTH)
        .with_help("Bytes to dump from the item (one read); needs --offset"),
];

/// The values of the TYPE operand and the items they name.
pub const METADATA_TYPES: [(&str, MetadataType); 3] = [
    ("merkle_tree", MetadataType::MerkleTree),
    ("descriptor", MetadataType::Descriptor),
    ("signature", MetadataType::Signature),
];

/// Bytes asked for per read when no `--length` is given (fsverity's).
const DEFAULT_LENGTH: u64 = 32768;

/// Runs `verityfs dump_metadata`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let (mut offset, mut length) = (None, None);
    let parsed = cmd.parse_options(args, LONGOPTS, |id, value| {
        usage_unless(match id {
            OPT_OFFSET => take_number(&mut offset, "--offset", value),
            _ => take_number(&mut length, "--length", value),
        })
    });
    let operands = match parsed {
        Ok(operands) => operands,
        Err(status) => return status,
    };
    let [kind, name] = operands.as_slice() else {
        return cmd.usage_error();
    };
    let Some(kind) = parse_metadata_type(kind) else {
        return cmd.usage_error();
    };
    let range = match (offset, length) {
        (None, Some(_)) => {
            error_msg("--length specified without --offset");
            return cmd.usage_error();
        }
        (Some(_), None) => {
            error_msg("--offset specified without --length");
            return cmd.usage_error();
        }
        (offset, length) => offset.zip(length),
    };
    match dump(kind, name, range) {
        Ok(()) => EXIT_OK,
        Err(()) => EXIT_FAILURE,
    }
}

/// Takes the value of `--offset` or `--length`; prints fsverity's message
/// and returns false if it is given twice or is not a number.
fn take_number(slot: &mut Option<u64>, name: &str, value: OsString) -> bool {
    if slot.is_some() {
        error_msg(format!("{name} can only be specified once"));
        return false;
    }
    // Not UTF-8: not a number either.
    *slot = value.to_str().and_then(parse_u64);
    if slot.is_none() {
        error_msg(format!("invalid value for {name}"));
    }
    slot.is_some()
}

fn parse_metadata_type(name: &OsStr) -> Option<MetadataType> {
    let found = METADATA_TYPES
        .iter()
        .find(|(n, _)| name.as_encoded_bytes() == n.as_bytes());
    if found.is_none() {
        error_msg(quote("unknown metadata type: ", name, ""));
        eprintln!("       Expected \"merkle_tree\", \"descriptor\", or \"signature\"");
    }
    found.map(|&(_, kind)| kind)
}

/// Writes the item to stdout: the single read of `range` (which may be
/// short), or everything in 32768-byte reads. Errors are printed here.
fn dump(kind: MetadataType, name: &OsStr, range: Option<(u64, u64)>) -> Result<(), ()> {
    let file = crate::locate::open(Path::new(name))
        .map_err(|e| error_msg_errno(quote("can't open '", name, "' for reading"), &e))?
        .file;
    let failed = |e: Error| {
        let msg = quote("FS_IOC_READ_VERITY_METADATA failed on '", name, "'");
        error_msg_errno(msg, &io::Error::from_raw_os_error(e.errno()));
    };
    let verifier = Verifier::new(ReadOptions::default());
    let file = VerityFile::open(&verifier, file, Path::new(name)).map_err(failed)?;
    let (mut offset, length) = range.unwrap_or((0, DEFAULT_LENGTH));
    if offset.checked_add(length).is_none() {
        failed(Error::InvalidArgument("offset + length overflows"));
        return Err(());
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
