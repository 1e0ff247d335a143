//! Mounting: the FUSE session, its options, and clean unmounting on
//! SIGINT/SIGTERM or when unmounted from outside.

use std::io;
use std::path::Path;

use fuser::{Config, MountOption, Session, SessionACL};

use crate::fs::{MountOptions, VerityFs};

/// The kernel's readahead window for the mount, in KiB. FUSE mounts get
/// 128 KiB by default, so sequential reads arrive as 128 KiB requests. A
/// 4 MiB window gives 1 MiB requests (the most FUSE sends by default), and
/// several of them in flight at once, so that the worker threads verify one
/// while the next is being read.
const READ_AHEAD_KB: u32 = 4096;

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

/// The `MAJ:MIN` of the filesystem mounted last on `mountpoint`, from
/// `/proc/self/mountinfo`.
fn mount_device(mountpoint: &Path) -> Option<String> {
    let wanted = std::fs::canonicalize(mountpoint.parent()?)
        .ok()?
        .join(mountpoint.file_name()?);
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let point = fields.get(4)?.replace("\\040", " ");
            (Path::new(&point) == wanted).then(|| fields.get(2).map(|d| d.to_string()))?
        })
        .next_back()
}

fn fuse_config(backing: &Path, options: &MountOptions) -> Config {
    let mut mount_options = vec![
        MountOption::FSName(backing.display().to_string()),
        MountOption::Subtype("verityfs".into()),
        MountOption::DefaultPermissions,
    ];
    if options.read_only {
        mount_options.push(MountOption::RO);
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if options.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    config
}

/// A FUSE session of a verityfs of `backing` on `mountpoint`, with its
/// readahead window set and its page cache invalidations served.
fn session(
    backing: &Path,
    mountpoint: &Path,
    options: &MountOptions,
) -> io::Result<Session<VerityFs>> {
    let fs = VerityFs::new(backing, options.clone())?;
    let invalidator = fs.invalidator.clone();
    let session = Session::new(fs, mountpoint, &fuse_config(backing, options))?;
    invalidator.serve(session.notifier())?;
    tune_readahead(mountpoint);
    Ok(session)
}

/// Mounts a verityfs of `backing` on `mountpoint` and serves it until it is
/// unmounted (`umount`, `fusermount3 -u`) or the process gets SIGINT or
/// SIGTERM, which unmount it cleanly.
pub fn run(backing: &Path, mountpoint: &Path, options: MountOptions) -> io::Result<()> {
    // Modes from the kernel are already masked with the caller's umask.
    rustix::process::umask(rustix::fs::Mode::empty());
    let mut session = session(backing, mountpoint, &options)?;
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
        let session = session(backing, mountpoint, &options)?.spawn()?;
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
