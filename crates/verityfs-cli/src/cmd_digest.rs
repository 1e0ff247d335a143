//! `verityfs digest`: compute fs-verity digests of files, as
//! `fsverity digest` does (fsverity-utils `programs/cmd_digest.c`).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use verityfs::{descriptor::formatted_digest, Descriptor};

use crate::commands::Command;
use crate::error::Result;
use crate::file_digest::{out_descriptor, out_merkle_tree, DigestOptions, HasDigest};
use crate::opts::{at_least_one, Args, Hint, Operand, Opt};
use crate::output::print_stdout;
use crate::tree_params::{block_size, hash_alg, salt};

/// Everything the options of `digest` ask for.
#[derive(Default)]
pub struct DigestArgs {
    digest: DigestOptions,
    compact: bool,
    for_builtin_sig: bool,
}

impl HasDigest for DigestArgs {
    fn digest(&mut self) -> &mut DigestOptions {
        &mut self.digest
    }
}

impl Args for DigestArgs {
    const OPTIONS: &'static [Opt<Self>] = &[
        hash_alg(),
        block_size(),
        salt(),
        out_merkle_tree(),
        out_descriptor(),
        Opt::<Self>::flag(
            "compact",
            "Print only the digest's hex string, without algorithm and file name",
            |a, _| {
                a.compact = true;
                Ok(())
            },
        )
        .new_line(),
        Opt::<Self>::flag(
            "for-builtin-sig",
            "Print the digest as a struct fsverity_formatted_digest, for built-in signatures",
            |a, _| {
                a.for_builtin_sig = true;
                Ok(())
            },
        ),
    ];
    const OPERANDS: &'static [Operand] = &[Operand::one(
        "FILE",
        "The file to compute the fs-verity digest of",
        Hint::File,
    )
    .times(crate::opts::Arity::OneOrMore)];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        for name in &at_least_one(operands)? {
            let descriptor = self.digest.compute(name)?;
            print_stdout(&self.output_line(&descriptor, name));
        }
        Ok(())
    }
}

impl DigestArgs {
    /// The line printed for `descriptor` of file `name`.
    fn output_line(&self, descriptor: &Descriptor, name: &OsStr) -> Vec<u8> {
        let alg = descriptor.params().hash_algorithm();
        let digest = descriptor.file_digest();
        let hex = if self.for_builtin_sig {
            verityfs::hash_algs::to_hex(&formatted_digest(alg, &digest))
        } else {
            digest.to_hex()
        };
        let mut line = match (self.compact, self.for_builtin_sig) {
            (true, _) => hex.into_bytes(),
            (false, true) => format!("{hex} ").into_bytes(),
            (false, false) => format!("{alg}:{hex} ").into_bytes(),
        };
        if !self.compact {
            line.extend_from_slice(name.as_bytes());
        }
        line.push(b'\n');
        line
    }
}
