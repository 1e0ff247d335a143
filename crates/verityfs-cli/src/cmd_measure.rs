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

use crate::commands::{Command, EXIT_FAILURE, EXIT_OK};
use crate::ioctl::measure_verity;
use crate::output::{error_msg_errno, open_for_reading, print_stdout, quote};

/// Runs `verityfs measure`.
pub fn run(cmd: &Command, files: &[OsString]) -> u8 {
    if files.is_empty() {
        return cmd.usage_error();
    }
    for name in files {
        let Some(file) = open_for_reading(name) else {
            return EXIT_FAILURE;
        };
        // Not through the kernel (or a mount): maybe a stored verity file.
        let measured =
            measure_verity(&file).or_else(|e| verityfs::measure_verity(&file).map_err(|_| e));
        let FsverityDigest { algorithm, digest } = match measured {
            Ok(measured) => measured,
            Err(e) => {
                let what = quote("FS_IOC_MEASURE_VERITY failed on '", name, "'");
                error_msg_errno(what, &e);
                return EXIT_FAILURE;
            }
        };
        let alg_name = match HashAlgorithm::from_id(algorithm.into()) {
            Ok(known) => known.name().to_owned(),
            Err(_) => format!("ALG_{algorithm}"),
        };
        let hex = verityfs::hash_algs::to_hex(&digest);
        print_stdout(&quote(&format!("{alg_name}:{hex} "), name, "\n"));
    }
    EXIT_OK
}
