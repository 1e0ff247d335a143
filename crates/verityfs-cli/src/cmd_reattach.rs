//! `verityfs reattach FILE...`: make verity backing files copied without
//! their extended attributes (plain `cp`, `tar` without `--xattrs`, `rsync`
//! without `-X`) verity files again, by writing back the location record
//! their metadata implies ([`verityfs::stripped::reattach`]). `verityfs
//! verify` points at the files that need it. Paths through a `verityfs
//! mount` reach their backing files.

use std::ffi::OsString;
use std::path::Path;

use verityfs::Error;

use crate::commands::{Command, EXIT_FAILURE, EXIT_OK};
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};

/// Runs `verityfs reattach`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let files = match cmd.parse_options(args, &[], |_, _| Ok(())) {
        Ok(files) if !files.is_empty() => files,
        Ok(_) => return cmd.usage_error(),
        Err(status) => return status,
    };
    let mut status = EXIT_OK;
    for name in &files {
        let file = match crate::locate::open(Path::new(name)) {
            Ok(located) => located.file,
            Err(e) => {
                error_msg_errno(quote("can't open '", name, "' for reading"), &e);
                status = EXIT_FAILURE;
                continue;
            }
        };
        match verityfs::stripped::reattach(&file) {
            Ok(location) => print_stdout(&quote(
                "",
                name,
                &format!(": verity again ({} bytes of data)\n", location.data_size),
            )),
            Err(e) => {
                let why = match e {
                    Error::NotVerity => "does not end with verity metadata".to_owned(),
                    Error::AlreadyVerity => "is already a verity file".to_owned(),
                    e => format!("can't be reattached: {e}"),
                };
                error_msg(quote("'", name, &format!("' {why}")));
                status = EXIT_FAILURE;
            }
        }
    }
    status
}
