//! The daemon's limit on open descriptors.
//!
//! Every inode the kernel holds costs the daemon one `O_PATH` descriptor
//! (see `inodes`), for as long as the kernel keeps it cached: a user who
//! looks up many files, as `find` does, must not run the daemon out of
//! descriptors, which would fail every lookup, open and create of every
//! user until the kernel forgets. The usual soft limit (1024, or a few
//! thousand) is far too low for that: it goes up to the hard limit, and a
//! daemon that may (root) raises both to the system's most
//! (`fs.nr_open`, a million by default), as libfuse's passthrough
//! examples do.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raises the limit as far as allowed; returns the soft limit now in force
/// (`None`: no limit).
pub(crate) fn raise_limit() -> Option<u64> {
    let hard = getrlimit(Resource::Nofile).maximum;
    let set = |most: Option<u64>| {
        let limit = Rlimit {
            current: most,
            maximum: most,
        };
        setrlimit(Resource::Nofile, limit).is_ok()
    };
    // Beyond the hard limit only with CAP_SYS_RESOURCE; else up to it.
    let higher = hard.and_then(|hard| system_most().filter(|&most| most > hard));
    let _ = higher.is_some_and(|most| set(Some(most))) || set(hard);
    getrlimit(Resource::Nofile).current
}

/// The most descriptors a process may have (`fs.nr_open`).
fn system_most() -> Option<u64> {
    let most = std::fs::read_to_string("/proc/sys/fs/nr_open").ok()?;
    most.trim().parse().ok()
}
