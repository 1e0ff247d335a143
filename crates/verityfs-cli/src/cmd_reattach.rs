//! `verityfs reattach FILE...`: make verity backing files copied without
//! their extended attributes (plain `cp`, `tar` without `--xattrs`, `rsync`
//! without `-X`) verity files again, by writing back the location record
//! their metadata implies ([`verityfs::stripped::reattach`]). `verityfs
//! verify` points at the files that need it. Paths through a `verityfs
//! mount` reach their backing files.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use verityfs::Error as LibError;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::opts::{at_least_one, Args, Arity, Hint, Operand, Opt};
use crate::output::{error_msg, print_stdout, quote};

/// `reattach` has no options.
#[derive(Default)]
pub struct ReattachArgs;

impl Args for ReattachArgs {
    const OPTIONS: &'static [Opt<Self>] = &[];
    const OPERANDS: &'static [Operand] = &[Operand::one(
        "FILE",
        "A backing file copied without its extended attributes",
        Hint::File,
    )
    .times(Arity::OneOrMore)];

    /// Reattaches every file, going on after failures (said on the way).
    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let mut failed = false;
        for name in &at_least_one(operands)? {
            if let Err(e) = reattach(name) {
                e.lines().iter().for_each(error_msg);
                failed = true;
            }
        }
        match failed {
            true => Err(Error::reported()),
            false => Ok(()),
        }
    }
}

/// Reattaches one file.
fn reattach(name: &OsStr) -> Result<()> {
    let file = crate::locate::open(Path::new(name))
        .map_err(|e| Error::io(quote("can't open '", name, "' for reading"), &e))?
        .file;
    let location = verityfs::stripped::reattach(&file).map_err(|e| {
        let why = match e {
            LibError::NotVerity => "does not end with verity metadata".to_owned(),
            LibError::AlreadyVerity => "is already a verity file".to_owned(),
            e => format!("can't be reattached: {e}"),
        };
        Error::msg(quote("'", name, &format!("' {why}")))
    })?;
    let done = format!(": verity again ({} bytes of data)\n", location.data_size);
    print_stdout(&quote("", name, &done));
    Ok(())
}
