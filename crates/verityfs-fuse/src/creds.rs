//! Acting as the caller. A daemon running as root serves other users: every
//! change it makes to the backing store on a user's behalf (creating,
//! linking, renaming, removing, changing modes, owners, times, flags and
//! extended attributes, opening, writing, enabling) runs on the worker
//! thread with that user's effective uid, gid and supplementary groups. The
//! backing filesystem then applies its own rules as if the user had made the
//! call: permission checks at the moment of the call (no check-then-use race
//! with a renamer), ownership and set-group-ID inheritance of new objects
//! (nothing is chowned afterwards, so nothing can be chowned by mistake),
//! protected hard links, quotas and reserved blocks (a non-zero effective
//! uid has no effective capabilities, `CAP_SYS_RESOURCE` included).
//!
//! Linux keeps credentials per thread; the raw `setresuid`/`setresgid`/
//! `setgroups` system calls change only the calling thread's, unlike the C
//! library's wrappers, which change every thread of the process.

use std::sync::OnceLock;

use fuser::Errno;
use rustix::process::{Gid, Uid};
use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};

use crate::caller::Caller;

/// The daemon's own groups, restored after each switch.
static DAEMON_GROUPS: OnceLock<Vec<Gid>> = OnceLock::new();

/// Whether requests can run as their callers: only a daemon whose effective
/// uid is root can switch, and only it needs to.
pub(crate) fn can_switch() -> bool {
    if !rustix::process::geteuid().is_root() {
        return false;
    }
    DAEMON_GROUPS.get_or_init(|| rustix::process::getgroups().unwrap_or_default());
    true
}

/// The calling thread runs as a caller until this is dropped.
struct AsCaller {
    daemon_gid: Gid,
}

impl AsCaller {
    fn assume(caller: &Caller, groups: Groups) -> Result<AsCaller, Errno> {
        let daemon_gid = rustix::process::getegid();
        let groups: Vec<Gid> = match groups {
            Groups::Caller => caller.groups().into_iter().map(Gid::from_raw).collect(),
            Groups::None => Vec::new(),
        };
        let guard = AsCaller { daemon_gid };
        // Groups and gid first: changing them needs CAP_SETGID, which the
        // thread loses with a non-root effective uid. The guard restores
        // whatever was changed if a later step fails.
        set_thread_groups(&groups).map_err(crate::inodes::errno)?;
        set_thread_res_gid(None, Gid::from_raw(caller.gid), None).map_err(crate::inodes::errno)?;
        set_thread_res_uid(None, Uid::from_raw(caller.uid), None).map_err(crate::inodes::errno)?;
        Ok(guard)
    }
}

impl Drop for AsCaller {
    fn drop(&mut self) {
        // The effective uid first: back to root restores the capabilities
        // needed to restore the rest. A thread that cannot become itself
        // again must not serve another request.
        let restored = set_thread_res_uid(None, Uid::ROOT, None)
            .and_then(|()| set_thread_res_gid(None, self.daemon_gid, None))
            .and_then(|()| set_thread_groups(DAEMON_GROUPS.get().map_or(&[], |g| g)));
        if let Err(e) = restored {
            tracing::error!("cannot restore the daemon's credentials: {e}");
            std::process::abort();
        }
    }
}

/// Which supplementary groups a request runs with.
#[derive(Clone, Copy)]
pub(crate) enum Groups {
    /// The caller's: for anything that checks permissions.
    Caller,
    /// None: for writes through a descriptor already open, which check no
    /// permission, so that they need not read the caller's groups.
    None,
}

/// Runs `f` with the credentials of `caller` when `switch` is set (a root
/// daemon), directly otherwise.
pub(crate) fn run_as<T>(
    switch: bool,
    caller: &Caller,
    groups: Groups,
    f: impl FnOnce() -> Result<T, Errno>,
) -> Result<T, Errno> {
    if !switch || caller.uid == 0 && caller.gid == 0 {
        return f();
    }
    let guard = AsCaller::assume(caller, groups)?;
    let result = f();
    drop(guard);
    result
}
