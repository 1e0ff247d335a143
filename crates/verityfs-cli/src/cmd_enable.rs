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
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

use verityfs::EnableRequest;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::ioctl::{enable_verity, EnableParams};
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::{open_for_reading, quote};
use crate::progress::bytes_bar;
use crate::tree_params::{block_size, hash_alg, once, salt, HasTree, TreeArgs};

/// The name of the command that enables without a mount.
pub const OFFLINE: &str = "enable-offline";

/// Largest signature file `fsverity enable` reads.
const MAX_SIGNATURE_FILE: u64 = 1_000_000;

/// Everything the options of `enable` ask for.
#[derive(Default)]
pub struct EnableArgs {
    tree: TreeArgs,
    signature: Option<Vec<u8>>,
}

impl HasTree for EnableArgs {
    fn tree(&mut self) -> &mut TreeArgs {
        &mut self.tree
    }
}

impl Args for EnableArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        hash_alg(),
        block_size(),
        salt(),
        Opt::<Self>::value(
            "signature",
            "SIGFILE",
            "Built-in signature to apply, a PKCS#7 DER file as `verityfs sign` writes",
            // Read at once, as fsverity does: a bad file ends the command
            // before the other options and the operands are looked at.
            |a, v| {
                once(&a.signature, "--signature")?;
                a.signature = Some(read_signature(&v)?);
                Ok(())
            },
        )
        .hint(Hint::File)
        .new_line(),
    ];
    const OPERANDS: &'static [Operand] = &[Operand::one(
        "FILE",
        "The file to enable fs-verity on",
        Hint::File,
    )];

    fn run(self, cmd: &Command, operands: Vec<OsString>) -> Result<()> {
        let [name] = exactly(operands)?;
        if cmd.name == OFFLINE && crate::locate::backing_path(Path::new(&name)).is_none() {
            return self.enable_offline(&name);
        }
        let file = open_for_reading(&name)?;
        let params = EnableParams {
            hash_algorithm: self.tree.hash_alg.unwrap_or(1),
            block_size: self.tree.block_size.unwrap_or(4096),
            salt: self.tree.salt.as_deref().unwrap_or_default(),
            signature: self.signature.as_deref().unwrap_or_default(),
        };
        enable_verity(&file, &params)
            .map_err(|e| Error::io(quote("FS_IOC_ENABLE_VERITY failed on '", &name, "'"), &e))
    }
}

impl EnableArgs {
    /// Enables verity on the backing file `name` with the library.
    fn enable_offline(&self, name: &OsStr) -> Result<()> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(name)
            .map_err(|e| Error::io(quote("can't open '", name, "' for writing"), &e))?;
        let size = file.metadata().map_or(0, |m| m.len());
        let bar = bytes_bar(size, &name.to_string_lossy());
        let enabled = self.tree.params().and_then(|params| {
            let request = EnableRequest {
                params,
                signature: self.signature.as_deref(),
                progress: &mut |done| {
                    bar.set_position(done);
                    true
                },
            };
            verityfs::enable_verity(&file, request)
        });
        if enabled.is_ok() {
            place_together(&file, Path::new(name));
        }
        bar.finish_and_clear();
        enabled
            .map(drop)
            .map_err(|e| Error::msg(quote("can't enable verity on '", name, &format!("': {e}"))))
    }
}

/// Lays out the just enabled verity file `file` at `path` on the disk with
/// its data and metadata together, as a mount does after an enable (see
/// [`verityfs::place_together`]), making the scratch copy in its
/// directory. An optimisation only: the file is verity either way, so a
/// failure is not reported.
pub fn place_together(file: &File, path: &Path) {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if let Ok(dir) = File::open(dir) {
        let _ = verityfs::place_together(file, &dir);
    }
}

/// Reads a signature file as fsverity's `read_signature()` does: it must be
/// non-empty and at most 1,000,000 bytes by `fstat()`, and then hold that
/// many bytes.
fn read_signature(name: &OsStr) -> Result<Vec<u8>> {
    let mut file = open_for_reading(name)?;
    let size = file
        .metadata()
        .map_err(|e| Error::io(quote("can't stat file '", name, "'"), &e))?
        .len();
    if size == 0 {
        return Err(Error::msg(quote("signature file '", name, "' is empty")));
    }
    if size > MAX_SIGNATURE_FILE {
        return Err(Error::msg(quote(
            "signature file '",
            name,
            "' is too large",
        )));
    }
    let mut sig = vec![0; size as usize];
    let mut done = 0;
    while done < sig.len() {
        match file.read(&mut sig[done..]) {
            Ok(0) => {
                return Err(Error::msg(quote("unexpected end-of-file on '", name, "'")));
            }
            Ok(n) => done += n,
            Err(e) => return Err(Error::io(quote("reading from '", name, "'"), &e)),
        }
    }
    Ok(sig)
}
