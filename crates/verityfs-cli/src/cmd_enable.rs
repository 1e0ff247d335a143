//! `verityfs enable`: enable fs-verity on a file with `FS_IOC_ENABLE_VERITY`,
//! as `fsverity enable` does (fsverity-utils `programs/cmd_enable.c`).
//!
//! The parameters go to the kernel unchecked beyond their syntax: an
//! unknown `--hash-alg` number, a block size the kernel refuses or a salt
//! over 32 bytes is the kernel's (or the FUSE daemon's) to refuse.
//!
//! `verityfs enable-offline` takes the same options and makes a backing
//! file of the verityfs layout verity directly with the library
//! ([`verityfs::enable_verity`]), without a mount: for preparing a backing
//! directory before serving it. The file must not be written meanwhile
//! (nothing enforces it, unlike on a mount). A path through a `verityfs
//! mount` is enabled through the mount, as by `enable`.

use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::io::Read;
use std::path::Path;

use verityfs::EnableRequest;

use crate::commands::{usage_unless, Command, EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::getopt::LongOpt;
use crate::ioctl::{enable_verity, EnableParams};
use crate::output::{error_msg, error_msg_errno, open_for_reading, quote};
use crate::progress::bytes_bar;
use crate::tree_params::{self, TreeArgs};

const OPT_SIGNATURE: u32 = 1;

/// The option of `enable` after the tree options.
const LONGOPTS: &[LongOpt] = &[LongOpt::required("signature", OPT_SIGNATURE)
    .with_help("Built-in signature to apply, a PKCS#7 DER file as `verityfs sign` writes")];

/// The name of the command that enables without a mount.
pub const OFFLINE: &str = "enable-offline";

/// All the options of `enable`: the tree options, then `--signature`.
pub fn longopts() -> Vec<LongOpt> {
    [&tree_params::LONGOPTS[..], LONGOPTS].concat()
}

/// Largest signature file `fsverity enable` reads.
const MAX_SIGNATURE_FILE: u64 = 1_000_000;

/// Runs `verityfs enable` and `verityfs enable-offline`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let mut tree = TreeArgs::default();
    let mut signature: Option<Vec<u8>> = None;
    let longopts = longopts();
    let parsed = cmd.parse_options(args, &longopts, |id, value| match id {
        OPT_SIGNATURE if signature.is_some() => {
            error_msg("--signature can only be specified once");
            Err(EXIT_USAGE)
        }
        // Read at once, as fsverity does: a bad file ends the command
        // before the other options and the operands are looked at.
        OPT_SIGNATURE => {
            signature = Some(read_signature(&value).ok_or(EXIT_FAILURE)?);
            Ok(())
        }
        _ => usage_unless(tree.parse_option(id, &value)),
    });
    let name = match parsed.as_deref() {
        Ok([name]) => name,
        Ok(_) => return cmd.usage_error(),
        Err(&status) => return status,
    };
    if cmd.name == OFFLINE && crate::locate::backing_path(Path::new(name)).is_none() {
        return enable_offline(name, &tree, signature.as_deref());
    }
    let Some(file) = open_for_reading(name) else {
        return EXIT_FAILURE;
    };
    let params = EnableParams {
        hash_algorithm: tree.hash_alg.unwrap_or(1),
        block_size: tree.block_size.unwrap_or(4096),
        salt: tree.salt.as_deref().unwrap_or_default(),
        signature: signature.as_deref().unwrap_or_default(),
    };
    if let Err(e) = enable_verity(&file, &params) {
        error_msg_errno(quote("FS_IOC_ENABLE_VERITY failed on '", name, "'"), &e);
        return EXIT_FAILURE;
    }
    EXIT_OK
}

/// Enables verity on the backing file `name` with the library.
fn enable_offline(name: &OsStr, tree: &TreeArgs, signature: Option<&[u8]>) -> u8 {
    let file = match OpenOptions::new().read(true).write(true).open(name) {
        Ok(file) => file,
        Err(e) => {
            error_msg_errno(quote("can't open '", name, "' for writing"), &e);
            return EXIT_FAILURE;
        }
    };
    let size = file.metadata().map_or(0, |m| m.len());
    let bar = bytes_bar(size, &name.to_string_lossy());
    let enabled = tree.params().and_then(|params| {
        let request = EnableRequest {
            params,
            signature,
            progress: &mut |done| {
                bar.set_position(done);
                true
            },
        };
        verityfs::enable_verity(&file, request)
    });
    bar.finish_and_clear();
    match enabled {
        Ok(_) => EXIT_OK,
        Err(e) => {
            error_msg(quote("can't enable verity on '", name, &format!("': {e}")));
            EXIT_FAILURE
        }
    }
}

/// Reads a signature file as fsverity's `read_signature()` does: it must be
/// non-empty and at most 1,000,000 bytes by `fstat()`, and then hold that
/// many bytes. Errors are printed here.
fn read_signature(name: &OsStr) -> Option<Vec<u8>> {
    let mut file = open_for_reading(name)?;
    let size = file
        .metadata()
        .map_err(|e| error_msg_errno(quote("can't stat file '", name, "'"), &e))
        .ok()?
        .len();
    if size == 0 {
        error_msg(quote("signature file '", name, "' is empty"));
        return None;
    }
    if size > MAX_SIGNATURE_FILE {
        error_msg(quote("signature file '", name, "' is too large"));
        return None;
    }
    let mut sig = vec![0; size as usize];
    let mut done = 0;
    while done < sig.len() {
        match file.read(&mut sig[done..]) {
            Ok(0) => {
                error_msg(quote("unexpected end-of-file on '", name, "'"));
                return None;
            }
            Ok(n) => done += n,
            Err(e) => {
                error_msg_errno(quote("reading from '", name, "'"), &e);
                return None;
            }
        }
    }
    Some(sig)
}
