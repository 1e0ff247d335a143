//! `verityfs stats MOUNTPOINT`: the read-path counters of a running mount,
//! as JSON (data blocks verified, tree blocks and requests, readahead,
//! cache hits and misses, verification failures, cache size).
//!
//! The daemon serves them as the virtual extended attribute
//! [`verityfs_fuse::STATS_XATTR`] of the mount's root directory.

use std::ffi::OsString;

use crate::commands::Command;
use crate::error::{Error, Result};
use crate::opts::{exactly, Args, Hint, Operand, Opt};
use crate::output::{print_stdout, quote};

/// `stats` has no options.
#[derive(Default)]
pub struct StatsArgs;

impl Args for StatsArgs {
    const OPTIONS: &'static [Opt<Self>] = &[];
    const OPERANDS: &'static [Operand] = &[Operand::one(
        "MOUNTPOINT",
        "The root directory of a running verityfs mount",
        Hint::Dir,
    )];

    fn run(self, _: &Command, operands: Vec<OsString>) -> Result<()> {
        let [mountpoint] = exactly(operands)?;
        let mut buf = vec![0u8; 4096];
        let read = rustix::fs::getxattr(
            mountpoint.as_os_str(),
            verityfs_fuse::STATS_XATTR,
            &mut buf[..],
        );
        match read {
            Ok(n) => {
                print_stdout(&buf[..n]);
                Ok(())
            }
            // Only the root of a verityfs mount has the attribute.
            Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => {
                let what = "' is not a verityfs mount (or not its root directory)";
                Err(Error::msg(quote("'", &mountpoint, what)))
            }
            Err(e) => {
                let what = quote("can't read the counters of '", &mountpoint, "'");
                Err(Error::io(what, &e.into()))
            }
        }
    }
}
