//! `verityfs`: fs-verity for any file system, with the command line of
//! fsverity-utils' `fsverity`.

mod cmd_digest;
mod commands;
mod getopt;
mod output;
mod progress;
mod tree_params;

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    ExitCode::from(commands::run(&args))
}
