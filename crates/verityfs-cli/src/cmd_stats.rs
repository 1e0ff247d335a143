//! `verityfs stats MOUNTPOINT`: the read-path counters of a running mount,
//! as JSON (data blocks verified, tree blocks and requests, readahead,
//! cache hits and misses, verification failures, cache size).
//!
//! The daemon serves them as the virtual extended attribute
//! [`verityfs_fuse::STATS_XATTR`] of the mount's root directory.

use std::ffi::OsString;

use crate::commands::{Command, EXIT_FAILURE, EXIT_OK};
use crate::output::{error_msg, error_msg_errno, print_stdout, quote};

/// Runs `verityfs stats`.
pub fn run(cmd: &Command, args: &[OsString]) -> u8 {
    let operands = match cmd.parse_options(args, &[], |_, _| Ok(())) {
        Ok(operands) => operands,
        Err(status) => return status,
    };
    let [mountpoint] = operands.as_slice() else {
        return cmd.usage_error();
    };
    let mut buf = vec![0u8; 4096];
    match rustix::fs::getxattr(
        mountpoint.as_os_str(),
        verityfs_fuse::STATS_XATTR,
        &mut buf[..],
    ) {
        Ok(n) => {
            print_stdout(&buf[..n]);
            EXIT_OK
        }
        // Only the root of a verityfs mount has the attribute.
        Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => {
            let what = "' is not a verityfs mount (or not its root directory)";
            error_msg(quote("'", mountpoint, what));
            EXIT_FAILURE
        }
        Err(e) => {
            let what = quote("can't read the counters of '", mountpoint, "'");
            error_msg_errno(what, &e.into());
            EXIT_FAILURE
        }
    }
}
