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

/// Whose credentials a request runs with: the caller's at the time of the
/// request, or for writes through a descriptor, its opener's (the kernel
/// sends the writeback of a shared mapping without credentials, as root).
#[derive(Clone, Debug)]
pub(crate) struct Creds {
    uid: u32,
    gid: u32,
    groups: Vec<Gid>,
}

impl Creds {
    /// The credentials of `caller`, supplementary groups included.
    pub(crate) fn of(caller: &Caller) -> Creds {
        let groups = if caller.uid == 0 && caller.gid == 0 {
            Vec::new()
        } else {
            caller.groups().into_iter().map(Gid::from_raw).collect()
        };
        Creds {
            uid: caller.uid,
            gid: caller.gid,
            groups,
        }
    }

    fn is_root(&self) -> bool {
        self.uid == 0 && self.gid == 0
    }
}

/// The calling thread runs with other credentials until this is dropped.
struct Switched {
    daemon_gid: Gid,
}

impl Switched {
    fn to(creds: &Creds) -> Result<Switched, Errno> {
        let guard = Switched {
            daemon_gid: rustix::process::getegid(),
        };
        // Groups and gid first: changing them needs CAP_SETGID, which the
        // thread loses with a non-root effective uid. The guard restores
        // whatever was changed if a later step fails.
        set_thread_groups(&creds.groups).map_err(crate::inodes::errno)?;
        set_thread_res_gid(None, Gid::from_raw(creds.gid), None).map_err(crate::inodes::errno)?;
        set_thread_res_uid(None, Uid::from_raw(creds.uid), None).map_err(crate::inodes::errno)?;
        Ok(guard)
    }
}

impl Drop for Switched {
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

/// Runs `f` with `creds` when `switch` is set (a root daemon), directly
/// otherwise.
pub(crate) fn run_as<T>(
    switch: bool,
    creds: &Creds,
    f: impl FnOnce() -> Result<T, Errno>,
) -> Result<T, Errno> {
    if !switch || creds.is_root() {
        return f();
    }
    let guard = Switched::to(creds)?;
    let result = f();
    drop(guard);
    result
}
