//! `verityfs`: fs-verity for any file system, with the command line of
//! fsverity-utils' `fsverity`.

// `unsafe` is refused but in the two modules that cannot do without.
#![deny(unsafe_code)]

mod bench;
mod cli_spec;
mod cmd_bench;
mod cmd_digest;
mod cmd_dump_metadata;
mod cmd_enable;
mod cmd_measure;
mod cmd_mount;
mod cmd_publish;
mod cmd_reattach;
mod cmd_sign;
mod cmd_stats;
mod cmd_verify;
mod commands;
mod digest_list;
mod error;
mod file_digest;
mod fuse_device;
// glibc's own getopt_long, for fsverity's exact option parsing.
#[allow(unsafe_code)]
mod getopt;
mod help;
mod image_location;
// The fs-verity ioctl(2) calls.
#[allow(unsafe_code)]
mod ioctl;
mod locate;
mod logging;
mod notify;
mod opts;
mod output;
mod progress;
mod scrub;
mod tree_params;

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    logging::init();
    let args: Vec<OsString> = std::env::args_os().collect();
    ExitCode::from(commands::run(&args))
}
