//! `verityfs digest`: compute fs-verity digests of files, as
//! `fsverity digest` does (fsverity-utils `programs/cmd_digest.c`).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use verityfs::{descriptor::formatted_digest, Descriptor};

use crate::commands::{usage_unless, Command, EXIT_FAILURE, EXIT_OK};
use crate::file_digest::{self, DigestOptions};
use crate::getopt::LongOpt;
use crate::output::print_stdout;

const OPT_COMPACT: u32 = 1;
const OPT_FOR_BUILTIN_SIG: u32 = 2;

/// The options of `digest` after the shared ones ([`file_digest::longopts`]).
const LONGOPTS: &[LongOpt] = &[
    LongOpt::flag("compact", OPT_COMPACT)
        .with_help("Print only the digest's hex string, without algorithm and file name"),
    LongOpt::flag("for-builtin-sig", OPT_FOR_BUILTIN_SIG).with_help(
        "Print the digest as a struct fsverity_formatted_digest, for built-in signatures",
    ),
];

/// All the options of `digest`, in fsverity's table order.
pub fn longopts() -> Vec<LongOpt> {
    file_digest::longopts(&[], LONGOPTS)
}

/// Everything the options of `digest` ask for.
#[derive(Default)]
struct DigestArgs {
    digest: DigestOptions,
    compact: bool,
    for_builtin_sig: bool,
}

/// Runs `verityfs digest`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let mut opts = DigestArgs::default();
    let longopts = longopts();
    let parsed = cmd.parse_options(args, &longopts, |id, value| {
        usage_unless(opts.take(id, &value))
    });
    let files = match parsed {
        Ok(files) if !files.is_empty() => files,
        Ok(_) => return cmd.usage_error(),
        Err(status) => return status,
    };
    for name in &files {
        match opts.digest.compute(name) {
            Ok(descriptor) => print_stdout(&opts.output_line(&descriptor, name)),
            Err(()) => return EXIT_FAILURE,
        }
    }
    EXIT_OK
}

impl DigestArgs {
    fn take(&mut self, id: u32, value: &OsStr) -> bool {
        match id {
            OPT_COMPACT => self.compact = true,
            OPT_FOR_BUILTIN_SIG => self.for_builtin_sig = true,
            _ => return self.digest.parse_option(id, value),
        }
        true
    }

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
