//! `verityfs measure`: print the fs-verity digests of verity files, as
//! `fsverity measure` v1.5 does (fsverity-utils `programs/cmd_measure.c`).
//!
//! A file on which `FS_IOC_MEASURE_VERITY` fails is also looked at as a
//! backing file of the verityfs layout (see `verityfs mount`): its digest
//! is the one the mount reports for it.
//!
//! Like v1.5, `measure` parses no options: every argument, `--` and
//! `--foo` included, is a file name (`--help` and `--version` are handled
//! before, by the dispatcher).

use std::ffi::OsString;

use verityfs::uapi::FsverityDigest;
use verityfs::HashAlgorithm;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::ioctl::measure_verity;
use crate::opts::{at_least_one, Args, Arity, Hint, Operand, Opt};
use crate::output::{open_for_reading, print_stdout, quote};

/// `measure` has no options.
#[derive(Default)]
pub struct MeasureArgs;

impl Args for MeasureArgs {
    const OPTIONS: &'static [Opt<Self>] = &[];
    const OPERANDS: &'static [Operand] =
        &[Operand::one("FILE", "A verity file", Hint::File).times(Arity::OneOrMore)];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        for name in &at_least_one(operands)? {
            let file = open_for_reading(name)?;
            // Not through the kernel (or a mount): maybe a stored verity file.
            let measured =
                measure_verity(&file).or_else(|e| verityfs::measure_verity(&file).map_err(|_| e));
            let FsverityDigest { algorithm, digest } = measured.map_err(|e| {
                Error::io(quote("FS_IOC_MEASURE_VERITY failed on '", name, "'"), &e)
            })?;
            let alg_name = match HashAlgorithm::from_id(algorithm.into()) {
                Ok(known) => known.name().to_owned(),
                Err(_) => format!("ALG_{algorithm}"),
            };
            let hex = verityfs::hash_algs::to_hex(&digest);
            print_stdout(&quote(&format!("{alg_name}:{hex} "), name, "\n"));
        }
        Ok(())
    }
}
