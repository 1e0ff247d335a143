//! Why a mount by a normal user failed, when the reason is `/dev/fuse`:
//! the kernel only says "Permission denied", which names neither the
//! device nor the remedy.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use rustix::fs::{access, Access};

/// The FUSE device.
const DEVICE: &str = "/dev/fuse";

/// What is wrong with `/dev/fuse` for this (non-root) user, and what to do,
/// or `None` if it is usable (or the user is root).
pub fn problem() -> Option<String> {
    if rustix::process::getuid().is_root() {
        return None;
    }
    let metadata = match std::fs::metadata(DEVICE) {
        Ok(metadata) => metadata,
        Err(e) => {
            return Some(format!(
                "{DEVICE}: {e}: load the fuse module (modprobe fuse)"
            ))
        }
    };
    if access(Path::new(DEVICE), Access::READ_OK | Access::WRITE_OK).is_ok() {
        return None;
    }
    Some(format!(
        "{DEVICE} (mode {:04o}, owner {}:{}) is not readable and writable by this user: \
         mounting without root needs it to be mode 0666, as distributions install it \
         (chmod 0666 {DEVICE}, or a udev rule), or mount as root",
        metadata.permissions().mode() & 0o7777,
        metadata.uid(),
        metadata.gid()
    ))
}
