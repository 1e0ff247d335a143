//! The mount system call, made on the mount point's descriptor.
//!
//! fuser mounts by name (it canonicalizes the path, then calls mount(2) on
//! the result), so a user who can write a directory on the way could swap
//! a symbolic link in between and have a root daemon mount over a
//! directory of their choosing. Here the mount point is the directory
//! [`verityfs::safe_dir::open_dir`] opened, and mount(2) is given
//! `/proc/self/fd/N`, which the kernel resolves to that very directory, as
//! systemd mounts on descriptors. The options are fuser's, turned into
//! mount(2)'s flags and data as fuser does.
//!
//! Without the privilege to mount (`EPERM`), and for `auto_unmount`
//! (which needs a `fusermount3` process watching the daemon), the mount is
//! left to fuser and `fusermount3`, which resolves the path again with
//! the rights of the user who runs it. That is why root may not use
//! `auto_unmount`: `fusermount3` run by root would follow any user's
//! symbolic link swapped in on the path.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use fuser::{Config, MountOption, SessionACL};
use rustix::mount::MountFlags;
use verityfs::safe_dir::OpenedDir;

/// Mounts a FUSE filesystem named `fsname` with `config`'s options on
/// `dir`, and returns its `/dev/fuse` descriptor; `None` if that is for
/// `fusermount3` to do.
pub(crate) fn mount(dir: &OpenedDir, config: &Config) -> io::Result<Option<OwnedFd>> {
    let options = &config.mount_options;
    if options.contains(&MountOption::AutoUnmount) {
        if rustix::process::geteuid().is_root() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "auto_unmount is refused to root: fusermount3 would look the mount point \
                 up again as root, following symbolic links others may have put on the path",
            ));
        }
        return Ok(None);
    }
    let device: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    let root = rustix::fs::fstat(dir.fd())?;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        device.as_raw_fd(),
        root.st_mode,
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw()
    );
    let mut flags = MountFlags::empty();
    let mut source = "verityfs";
    for option in options {
        match option {
            MountOption::FSName(name) => source = name,
            MountOption::CUSTOM(kernel_option) => push(&mut data, kernel_option),
            MountOption::DefaultPermissions => push(&mut data, "default_permissions"),
            option => flags |= flag(option),
        }
    }
    if config.acl != SessionACL::Owner {
        // `allow_root` too: fuser refuses others' requests itself.
        push(&mut data, "allow_other");
    }
    let data = CString::new(data).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let target = format!("/proc/self/fd/{}", dir.fd().as_raw_fd());
    match rustix::mount::mount(source, &target, "fuse", flags, Some(&*data)) {
        Ok(()) => Ok(Some(device)),
        Err(rustix::io::Errno::PERM) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn push(data: &mut String, option: &str) {
    data.push(',');
    data.push_str(option);
}

/// The mount(2) flag of a kernel option (none for the defaults they
/// undo: `dev`, `suid`, `exec`, `atime`, `async`, `rw`).
fn flag(option: &MountOption) -> MountFlags {
    match option {
        MountOption::NoDev => MountFlags::NODEV,
        MountOption::NoSuid => MountFlags::NOSUID,
        MountOption::NoExec => MountFlags::NOEXEC,
        MountOption::NoAtime => MountFlags::NOATIME,
        MountOption::Sync => MountFlags::SYNCHRONOUS,
        MountOption::DirSync => MountFlags::DIRSYNC,
        MountOption::RO => MountFlags::RDONLY,
        _ => MountFlags::empty(),
    }
}

/// `config` as `fusermount3` must be given it: the `fsname` (a path,
/// which may hold commas) with `\` and `,` escaped as libfuse does, since
/// fuser joins the options with commas and `fusermount3` splits them
/// there, so that a name cannot add options. mount(2) takes the name as
/// its source, unescaped.
pub(crate) fn for_fusermount(config: &Config) -> Config {
    let mut config = config.clone();
    for option in &mut config.mount_options {
        if let MountOption::FSName(name) = option {
            *name = name.replace('\\', "\\\\").replace(',', "\\,");
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusermount3_gets_an_escaped_fsname() {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName(r"/a,allow_other\b".into()),
            MountOption::NoDev,
        ];
        let escaped = for_fusermount(&config);
        assert_eq!(
            escaped.mount_options,
            [
                MountOption::FSName(r"/a\,allow_other\\b".into()),
                MountOption::NoDev
            ]
        );
    }
}
