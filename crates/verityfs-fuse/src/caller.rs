//! Who is calling, and whether they are still waiting: the kernel applies
//! no fs-verity permission rules to FUSE files, and a caller blocked in a
//! FUSE request cannot be interrupted, so the daemon looks for itself.

use std::fs;

/// The credentials and process of a FUSE request.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Thread id of the calling task.
    pub pid: u32,
}

/// Signals whose default action is not to terminate the process.
const NON_FATAL_DEFAULT: &[u32] = &[
    libc::SIGCHLD as u32,
    libc::SIGCONT as u32,
    libc::SIGURG as u32,
    libc::SIGWINCH as u32,
];

impl Caller {
    /// Whether the caller may write a file with `mode`, `uid` and `gid`, as
    /// `inode_permission(MAY_WRITE)` decides: root always may; otherwise
    /// the owner, group (primary or supplementary) or other write bit.
    pub fn may_write(&self, mode: u32, uid: u32, gid: u32) -> bool {
        if self.uid == 0 {
            return true;
        }
        if self.uid == uid {
            return mode & 0o200 != 0;
        }
        if self.gid == gid || self.groups().contains(&gid) {
            return mode & 0o020 != 0;
        }
        mode & 0o002 != 0
    }

    /// Supplementary groups, from `/proc/<pid>/status`. Empty (the least
    /// privilege) if the process is gone or its filesystem uid and gid are
    /// no longer the request's: its pid may have been reused.
    pub fn groups(&self) -> Vec<u32> {
        let fs_id = |name| {
            self.status_field(name)
                .and_then(|v| v.split_whitespace().nth(3)?.parse::<u32>().ok())
        };
        if fs_id("Uid:") != Some(self.uid) || fs_id("Gid:") != Some(self.gid) {
            return Vec::new();
        }
        self.status_field("Groups:")
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|g| g.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn status_field(&self, name: &str) -> Option<String> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with(name))?;
        Some(line[name.len()..].trim().to_owned())
    }

    /// Whether the caller has a signal pending that will kill it (or is
    /// gone): then nobody waits for the answer and long work can stop.
    pub fn fatal_signal_pending(&self) -> bool {
        let Ok(status) = fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return true;
        };
        let mask = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .unwrap_or(0)
        };
        let pending = mask("SigPnd:") | mask("ShdPnd:");
        let kill = 1u64 << (libc::SIGKILL - 1);
        if pending & kill != 0 {
            return true;
        }
        let handled = mask("SigCgt:") | mask("SigIgn:") | mask("SigBlk:");
        let harmless = NON_FATAL_DEFAULT
            .iter()
            .fold(0u64, |m, &s| m | 1 << (s - 1));
        pending & !handled & !harmless & 0xffff_ffff != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_permission_bits() {
        let user = Caller {
            uid: 1000,
            gid: 1000,
            pid: std::process::id(),
        };
        assert!(user.may_write(0o644, 1000, 5));
        assert!(!user.may_write(0o444, 1000, 5));
        assert!(!user.may_write(0o664, 2000, 5));
        assert!(user.may_write(0o666, 2000, 5));
        assert!(user.may_write(0o460, 2000, 1000));
        let root = Caller { uid: 0, ..user };
        assert!(root.may_write(0o444, 1000, 5));
    }

    #[test]
    fn no_fatal_signal_for_a_live_process() {
        let me = Caller {
            uid: 0,
            gid: 0,
            pid: std::process::id(),
        };
        assert!(!me.fatal_signal_pending());
        let gone = Caller {
            pid: u32::MAX - 1,
            ..me
        };
        assert!(gone.fatal_signal_pending());
    }
}
