//! Mounting: the FUSE session, its options, and clean unmounting on
//! SIGINT/SIGTERM or when unmounted from outside.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use fuser::{Config, INodeNo, MountOption, Notifier, Session, SessionACL, SessionUnmounter};

use crate::fs::{MountOptions, VerityFs};
use crate::mountinfo::mount_on;
use crate::placement::FSTYPE;

/// The kernel's readahead window for the mount, in KiB. FUSE mounts get
/// 128 KiB by default, so sequential reads arrive as 128 KiB requests. A
/// 4 MiB window gives 1 MiB requests (the most FUSE sends by default), and
/// several of them in flight at once, so that the worker threads verify one
/// while the next is being read.
const READ_AHEAD_KB: u32 = 4096;

/// What the filesystem knows of its own mount once mounted: where it is, to
/// see the flags `mount -o remount` changes (the kernel does not tell FUSE
/// daemons), and how to unmount it when serving ends.
#[derive(Default)]
pub(crate) struct MountState {
    /// The canonical mount point and the mount's `MAJ:MIN`.
    mounted: OnceLock<(PathBuf, String)>,
    unmounter: Mutex<Option<SessionUnmounter>>,
    notifier: OnceLock<Notifier>,
}

impl MountState {
    /// Whether the mount is read-only now (mounted `ro`, or remounted so).
    pub(crate) fn read_only(&self) -> bool {
        let Some((point, device)) = self.mounted.get() else {
            return false;
        };
        matches!(mount_on(point), Ok(Some(m)) if &m.device == device && m.read_only())
    }

    /// Drops the kernel's cached attributes of `ino`, after a change the
    /// kernel does not expect to change them (inode flags change the
    /// ctime).
    pub(crate) fn attributes_changed(&self, ino: INodeNo) {
        if let Some(notifier) = self.notifier.get() {
            // A negative offset: attributes only, not the page cache.
            if let Err(e) = notifier.inval_inode(ino, -1, 0) {
                tracing::debug!("cannot invalidate the attributes of inode {}: {e}", ino.0);
            }
        }
    }

    /// Whether our mount is still in the mount table.
    fn present(&self) -> bool {
        let Some((point, device)) = self.mounted.get() else {
            return false;
        };
        matches!(mount_on(point), Ok(Some(m)) if &m.device == device)
    }

    /// Unmounts at the end of serving. After an external `umount`, a
    /// normal way to stop, fuser 0.18 takes the gone mount for a live one
    /// (its `is_mounted` reads the device's `POLLERR` backwards) and calls
    /// umount(2) again, which fails with `EINVAL`: taking the mount here
    /// first, that error is expected and not worth a warning.
    pub(crate) fn release(&self) {
        let unmounter = self
            .unmounter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(mut unmounter) = unmounter else {
            return;
        };
        let present = self.present();
        match unmounter.unmount() {
            Ok(()) => {}
            Err(e) if !present => tracing::debug!("already unmounted ({e})"),
            Err(e) => tracing::warn!("unmount failed: {e}"),
        }
    }

    /// Records the mount of `session` on `mountpoint`.
    fn mounted<FS: fuser::Filesystem>(&self, session: &mut Session<FS>, mountpoint: &Path) {
        if let Some(device) = mount_device(mountpoint) {
            let _ = self.mounted.set((mountpoint.to_owned(), device));
        }
        *self.unmounter.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(session.unmount_callable());
        let _ = self.notifier.set(session.notifier());
    }
}

/// Sets the mount's readahead window (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`,
/// writable by root only; others keep the default). It must not stat the
/// mountpoint: that would be a FUSE request nobody serves yet.
fn tune_readahead(mountpoint: &Path) {
    let Some(device) = mount_device(mountpoint) else {
        return;
    };
    let path = format!("/sys/class/bdi/{device}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, READ_AHEAD_KB.to_string()) {
        tracing::debug!("cannot set {path}: {e}");
    }
}

/// The `MAJ:MIN` of the filesystem mounted last on `mountpoint`.
fn mount_device(mountpoint: &Path) -> Option<String> {
    Some(mount_on(mountpoint).ok()??.device)
}

/// Pairs of opposite flags: the last one given wins, as with mount(8).
const OPPOSITES: &[(&str, &str)] = &[
    ("dev", "nodev"),
    ("suid", "nosuid"),
    ("exec", "noexec"),
    ("atime", "noatime"),
    ("sync", "async"),
];

/// Options about access times that FUSE leaves to the daemon: the backing
/// filesystem keeps the times, as its own mount options say.
const ATIME_OPTIONS: &[&str] = &[
    "diratime",
    "nodiratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
];

/// Whether `option` is a mount option of the kernel, FUSE or fusermount3
/// that [`MountOptions::mount_options`] may hold.
pub fn accepts_mount_option(option: &str) -> bool {
    ATIME_OPTIONS.contains(&option)
        || option == "allow_root"
        || option == "default_permissions"
        || fuse_option(option).is_some()
}

/// Whether option `new` overrides an earlier `old`: the same option (with
/// any value), or its opposite.
fn replaces(new: &str, old: &str) -> bool {
    let name = |o: &str| o.split_once('=').map_or(o, |(n, _)| n).to_owned();
    name(new) == name(old)
        || OPPOSITES
            .iter()
            .any(|&(a, b)| (new, old) == (a, b) || (new, old) == (b, a))
}

fn fuse_option(option: &str) -> Option<MountOption> {
    Some(match option {
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        "dirsync" => MountOption::DirSync,
        "auto_unmount" => MountOption::AutoUnmount,
        o if o.starts_with("fsname=") => MountOption::FSName(o["fsname=".len()..].into()),
        // As a kernel option: fuser's Subtype is only given to fusermount3,
        // so a mount(2) by root would show as plain `fuse` (and mount(8)
        // could not find our helper for `mount -o remount`).
        o if o.starts_with("subtype=") => MountOption::CUSTOM(o.into()),
        _ => return None,
    })
}

/// The options of a mount of `backing` (canonical): named after it, of type
/// `fuse.verityfs`, `nodev,nosuid` unless asked otherwise, the kernel
/// checking permissions, then the user's options (the last of two
/// opposites wins).
fn fuse_config(backing: &Path, options: &MountOptions) -> Config {
    let mut names: Vec<String> = vec![
        format!("fsname={}", backing.display()),
        format!("subtype={}", &FSTYPE["fuse.".len()..]),
        "nodev".into(),
        "nosuid".into(),
    ];
    for option in &options.mount_options {
        names.retain(|old| !replaces(option, old));
        names.push(option.clone());
    }
    let mut mount_options: Vec<MountOption> = names.iter().filter_map(|n| fuse_option(n)).collect();
    mount_options.push(MountOption::DefaultPermissions);
    if options.read_only {
        mount_options.push(MountOption::RO);
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if options.allow_other {
        SessionACL::All
    } else if names
        .iter()
        .any(|n| n == "allow_root" || n == "auto_unmount")
    {
        // fuser refuses auto_unmount to the owner alone; root may reach
        // any user's mount anyway.
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    config
}

/// The canonical paths of `backing` and `mountpoint`, checked for a layout
/// that can be served (see `placement`).
fn prepare(backing: &Path, mountpoint: &Path) -> io::Result<(PathBuf, PathBuf)> {
    let canonical = |path: &Path| {
        std::fs::canonicalize(path)
            .map_err(|e| io::Error::new(e.kind(), format!("'{}': {e}", path.display())))
    };
    let (backing, mountpoint) = (canonical(backing)?, canonical(mountpoint)?);
    crate::placement::check(&backing, &mountpoint)?;
    Ok((backing, mountpoint))
}

/// Mounts `fs` of `backing` on `mountpoint`, and tells it so.
fn new_session(
    fs: VerityFs,
    backing: &Path,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<Session<VerityFs>> {
    let state = fs.mount.clone();
    let invalidator = fs.invalidator.clone();
    let mut session =
        Session::new(fs, mountpoint, &fuse_config(backing, options)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mounting on '{}': {e}", mountpoint.display()),
            )
        })?;
    invalidator.serve(session.notifier())?;
    tune_readahead(mountpoint);
    state.mounted(&mut session, mountpoint);
    Ok(session)
}

/// Mounts a verityfs of `backing` on `mountpoint` and serves it until it is
/// unmounted (`umount`, `fusermount3 -u`) or the process gets SIGINT or
/// SIGTERM, which unmount it cleanly.
pub fn run(backing: &Path, mountpoint: &Path, options: MountOptions) -> io::Result<()> {
    // Messages about the backing directory name it as the user did.
    let fs = VerityFs::new(backing, options.clone())?;
    let (backing, mountpoint) = prepare(backing, mountpoint)?;
    // Modes from the kernel are already masked with the caller's umask.
    rustix::process::umask(rustix::fs::Mode::empty());
    let mut session = new_session(fs, &backing, &mountpoint, &options)?;
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                tracing::info!("signal {signal}: unmounting");
                if let Err(e) = unmounter.unmount() {
                    tracing::error!("unmount failed: {e}");
                }
            }
        })?;
    tracing::info!("serving {} on {}", backing.display(), mountpoint.display());
    session.run()
}

/// A mount served by background threads, unmounted when dropped (for tests
/// and programs embedding the filesystem).
pub struct BackgroundMount {
    session: Option<fuser::BackgroundSession>,
}

impl BackgroundMount {
    /// Mounts `backing` on `mountpoint` in the background.
    pub fn spawn(backing: &Path, mountpoint: &Path, options: MountOptions) -> io::Result<Self> {
        let fs = VerityFs::new(backing, options.clone())?;
        let (backing, mountpoint) = prepare(backing, mountpoint)?;
        let session = new_session(fs, &backing, &mountpoint, &options)?.spawn()?;
        Ok(BackgroundMount {
            session: Some(session),
        })
    }

    /// Unmounts and waits for the serving threads.
    pub fn unmount(mut self) -> io::Result<()> {
        self.session.take().map_or(Ok(()), |s| s.umount_and_join())
    }
}

impl Drop for BackgroundMount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}
