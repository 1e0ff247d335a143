//! Mounting: the FUSE session, its options, and clean unmounting on
//! SIGINT/SIGTERM or when unmounted from outside.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fuser::{
    Config, Filesystem, INodeNo, MountOption, Notifier, Session, SessionACL, SessionUnmounter,
};

use rustix::mount::{unmount, UnmountFlags};
use verityfs::safe_dir::{open_dir, open_dir_following, OpenedDir};

use crate::direct_mount;
use crate::filesystem::Served;
use crate::fs::{MountOptions, VerityFs};
use crate::image_fs::ImageFs;
use crate::invalidate::Invalidator;
use crate::mount_point::MountPoint;
use crate::mountinfo::MountEntry;
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
    ours: OnceLock<Arc<OurMount>>,
    unmounter: Mutex<Option<SessionUnmounter>>,
    notifier: OnceLock<Notifier>,
}

impl MountState {
    /// Whether the mount is read-only now (mounted `ro`, or remounted so).
    pub(crate) fn read_only(&self) -> bool {
        let entry = self.ours.get().map(|ours| ours.entry());
        matches!(entry, Some(Ok((_, m))) if m.read_only())
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
        self.ours.get().is_some_and(|ours| ours.entry().is_ok())
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

    /// Records `ours`, the mount of `session`.
    fn mounted<FS: fuser::Filesystem>(&self, session: &mut Session<FS>, ours: Arc<OurMount>) {
        let _ = self.ours.set(ours);
        *self.unmounter.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(session.unmount_callable());
        let _ = self.notifier.set(session.notifier());
    }
}

/// What mounting needs of a filesystem besides serving its requests.
pub(crate) trait Mountable: Filesystem {
    /// Its record of its mount.
    fn mount_state(&self) -> Arc<MountState>;
    /// What sends the kernel invalidations, if it does.
    fn invalidator(&self) -> Option<Arc<Invalidator>>;
}

impl Mountable for Served {
    fn mount_state(&self) -> Arc<MountState> {
        self.mount.clone()
    }

    fn invalidator(&self) -> Option<Arc<Invalidator>> {
        Some(self.invalidator.clone())
    }
}

impl Mountable for ImageFs {
    fn mount_state(&self) -> Arc<MountState> {
        self.mount.clone()
    }

    /// An image never changes: nothing to invalidate.
    fn invalidator(&self) -> Option<Arc<Invalidator>> {
        None
    }
}

/// Options an image mount always has, whatever `-o` says: its files'
/// set-user-ID bits and device numbers are the publisher's, and only trust
/// in their digest, not in the publisher, is asked for.
const IMAGE_FORCED: &[&str] = &["nodev", "nosuid"];

/// Sets the readahead window of the mount of `device` (`MAJ:MIN`), in
/// `/sys/class/bdi/MAJ:MIN/read_ahead_kb` (writable by root only; others
/// keep the default). The device is the mount table's: a stat of the
/// mount point would be a FUSE request nobody serves yet.
fn tune_readahead(device: &str) {
    let path = format!("/sys/class/bdi/{device}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, READ_AHEAD_KB.to_string()) {
        tracing::debug!("cannot set {path}: {e}");
    }
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

/// The options of a mount named `fsname` (the canonical backing directory,
/// or the image as given): of type `fuse.verityfs`, `nodev,nosuid` unless
/// asked otherwise, the kernel checking permissions, then the user's
/// options (the last of two opposites wins), then the `forced` ones.
fn fuse_config(fsname: &str, options: &MountOptions, forced: &[&str]) -> Config {
    let mut names: Vec<String> = vec![
        format!("fsname={fsname}"),
        format!("subtype={}", &FSTYPE["fuse.".len()..]),
        "nodev".into(),
        "nosuid".into(),
    ];
    let forced = forced.iter().map(|&f| f.to_owned());
    for option in options.mount_options.iter().cloned().chain(forced) {
        names.retain(|old| !replaces(&option, old));
        names.push(option);
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

/// A mount point, resolved once: the directory mounted on, and its path
/// as the mount table shows it before the mount (for the checks before
/// it, messages, and `fusermount3`; once mounted, [`OurMount`] knows
/// where the mount is).
struct Target<'a> {
    dir: &'a OpenedDir,
    path: PathBuf,
}

impl<'a> Target<'a> {
    fn new(dir: &'a OpenedDir) -> io::Result<Self> {
        Ok(Target {
            path: dir.path()?,
            dir,
        })
    }
}

/// The canonical path of `backing` and the mount point `dir`, checked for
/// a layout that can be served (see `placement`).
fn prepare<'a>(backing: &OpenedDir, dir: &'a OpenedDir) -> io::Result<(PathBuf, Target<'a>)> {
    let path = backing.path()?;
    let target = Target::new(dir)?;
    crate::placement::check(backing.fd(), &path, &target.path, dir.fd())?;
    Ok((path, target))
}

/// The options of an image mount: read-only, whatever was asked.
fn image_options(options: MountOptions) -> MountOptions {
    MountOptions {
        read_only: true,
        ..options
    }
}

/// Mounts `fs` named `fsname` on `target`, and tells it so; returns the
/// session and the mount. The mount is made on the target's descriptor
/// ([`direct_mount`]); where that takes `fusermount3`, fuser runs it on
/// the target's path, which `fusermount3` resolves again with the rights
/// of the user who mounts (refusing a final symbolic link, and mounting on
/// the directory it changed into).
fn new_session<FS: Mountable>(
    fs: FS,
    fsname: &str,
    target: &Target,
    options: &MountOptions,
    forced: &[&str],
) -> io::Result<(Session<FS>, Arc<OurMount>)> {
    let state = fs.mount_state();
    let invalidator = fs.invalidator();
    let config = fuse_config(fsname, options, forced);
    let mountpoint = &target.path;
    let session = match direct_mount::mount(target.dir, &config) {
        Ok(Some(device)) => Session::from_fd(fs, device, config.acl, config),
        Ok(None) => Session::new(fs, mountpoint, &direct_mount::for_fusermount(&config)),
        Err(e) => Err(e),
    };
    let mut session = session.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("mounting on '{}': {e}", mountpoint.display()),
        )
    })?;
    if let Some(invalidator) = invalidator {
        invalidator.serve(session.notifier())?;
    }
    let ours = Arc::new(OurMount::made_on(target.dir));
    if let Ok((_, device)) = &ours.known {
        tune_readahead(device);
    }
    state.mounted(&mut session, ours.clone());
    Ok((session, ours))
}

/// Mounts a verityfs of the directory `backing_dir` (named `backing` in
/// messages, and opened with [`verityfs::safe_dir::open_dir_following`])
/// on the directory `mountpoint` (opened with
/// [`verityfs::safe_dir::open_dir`]) and serves it until it is
/// unmounted (`umount`, `fusermount3 -u`) or the process gets SIGINT or
/// SIGTERM, which unmount it cleanly. `mounted` is called once the mount
/// is there (before its requests are served: they wait for the server).
pub fn run(
    backing: &Path,
    backing_dir: OpenedDir,
    mountpoint: &OpenedDir,
    options: MountOptions,
    mounted: impl FnOnce(),
) -> io::Result<()> {
    let (path, target) = prepare(&backing_dir, mountpoint)?;
    // Messages about the backing directory name it as the user did.
    let fs = VerityFs::new(backing_dir.into_fd(), backing, options.clone())?;
    let fsname = path.display().to_string();
    serve(Served::new(fs), &fsname, &target, &options, &[], mounted)
}

/// Mounts the image `fs`, named `name` (its location as given), read-only
/// on the directory `mountpoint`, and serves it as [`run`] does.
pub fn run_image(
    fs: ImageFs,
    name: &str,
    mountpoint: &OpenedDir,
    options: MountOptions,
    mounted: impl FnOnce(),
) -> io::Result<()> {
    let target = Target::new(mountpoint)?;
    serve(
        fs,
        name,
        &target,
        &image_options(options),
        IMAGE_FORCED,
        mounted,
    )
}

/// Mounts `fs`, calls `mounted`, and serves it until unmounted or
/// signalled.
fn serve<FS: Mountable>(
    fs: FS,
    fsname: &str,
    target: &Target,
    options: &MountOptions,
    forced: &[&str],
    mounted: impl FnOnce(),
) -> io::Result<()> {
    // Modes from the kernel are already masked with the caller's umask.
    rustix::process::umask(rustix::fs::Mode::empty());
    let descriptors = crate::descriptors::raise_limit();
    tracing::debug!("open descriptors allowed: {descriptors:?} (none: no limit)");
    // Caught from before the mount exists: a signal sent as soon as the
    // mount shows must unmount it, not kill the daemon and leave the mount
    // without its server.
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
    let (session, ours) = new_session(fs, fsname, target, options, forced)?;
    mounted();
    // Unmounted only while its place still holds our mount, never
    // through a symlink (fuser's own unmount follows whatever the name
    // leads to: a user owning a parent directory could put another mount
    // there).
    let signalled = ours.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            // Every signal tries again: an unmount refused (another mount
            // stacked on ours meanwhile) may succeed once that one is gone.
            for signal in signals.forever() {
                tracing::info!("signal {signal}: unmounting");
                match signalled.unmount_or_detach() {
                    Ok(()) => return,
                    Err(e) => tracing::error!("unmount failed: {e}"),
                }
            }
        })?;
    tracing::info!("serving {fsname} on {}", ours.name());
    ended(join_without_unmount(session.spawn()?))
}

/// Waits for `session`'s server to end, and returns how it ended, without
/// letting fuser unmount: at its end, fuser unmounts its mount point by
/// name, following whatever the name leads to by then. Once a user owning
/// a parent directory has moved the mount away and put a symlink to another
/// mount at the name, an administrator's `umount` of ours would have
/// unmounted that one too. Our unmounts are checked ([`OurMount`]); the
/// session is never dropped (the process or the embedder goes on without
/// it; the kernel has ended the connection).
fn join_without_unmount(mut session: fuser::BackgroundSession) -> io::Result<()> {
    let placeholder = std::thread::spawn(|| Ok(()));
    let server = std::mem::replace(&mut session.guard, placeholder);
    std::mem::forget(session);
    server
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the file system's server panicked")))
}

/// How serving ended: the kernel ends a connection with `ENODEV` once
/// unmounted, which fuser takes as the end; a mount detached while busy
/// may instead end, once its last file is closed, with `ECONNABORTED`
/// (the connection torn down, as an administrator's abort does): the
/// mount is gone either way, which is the end of serving, not a failure.
fn ended(served: io::Result<()>) -> io::Result<()> {
    match served {
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
            tracing::info!("the kernel ended the connection: {e}");
            Ok(())
        }
        served => served,
    }
}

/// How long a signalled daemon retries unmounting a busy mount before it
/// detaches it.
const BUSY_RETRY: Duration = Duration::from_secs(2);

/// Our mount: its place ([`MountPoint`]: the parent directory held open,
/// and the name there) and its device, as they were once it was made.
struct OurMount {
    /// The place and the device (`MAJ:MIN`), or why they could not be
    /// had: then nothing there is taken for our mount.
    known: Result<(MountPoint, String), String>,
}

impl OurMount {
    /// The mount just made on `dir`.
    fn made_on(dir: &OpenedDir) -> OurMount {
        let known = MountPoint::of(dir.fd()).and_then(|point| match point.mount()? {
            Some(m) => Ok((point, m.device)),
            None => Err(io::Error::other("it is not in the mount table")),
        });
        let known = known.map_err(|e| {
            tracing::warn!("cannot tell where the mount is ({e}): it will not be unmounted");
            e.to_string()
        });
        OurMount { known }
    }

    /// Its path now, for messages.
    fn name(&self) -> String {
        match &self.known {
            Ok((point, _)) => match point.path() {
                Ok(path) => path.display().to_string(),
                Err(e) => format!("the mount (its path: {e})"),
            },
            Err(_) => "the mount".into(),
        }
    }

    /// Its place and entry in the mount table, while the place still
    /// holds it: the mount may have been moved away (`mount --move`) and
    /// another one made there, which root must not unmount.
    fn entry(&self) -> io::Result<(&MountPoint, MountEntry)> {
        let (point, device) = self
            .known
            .as_ref()
            .map_err(|why| io::Error::other(format!("where the mount is is not known: {why}")))?;
        match point.mount()? {
            Some(m) if &m.device == device => Ok((point, m)),
            _ => Err(io::Error::other(format!(
                "{} no longer leads to this mount",
                self.name()
            ))),
        }
    }

    /// Unmounts it, or if busy, retries and then detaches it
    /// ([`OurMount::unmount_busy`]).
    fn unmount_or_detach(&self) -> io::Result<()> {
        self.unmount(UnmountFlags::empty())
            .or_else(|e| self.unmount_busy(e))
    }

    /// Unmounts it after a first unmount failed with `error`. A file just
    /// closed keeps the mount busy for a moment (the kernel releases it
    /// asynchronously), so a busy mount is tried again for a while, then
    /// detached (`umount -l`, as libfuse unmounts): a signal or a dropped
    /// mount ends the mount, and its server stops once the files still
    /// open are closed. Every attempt goes through the mount's place, and
    /// only while the place still holds our mount.
    fn unmount_busy(&self, error: io::Error) -> io::Result<()> {
        let busy = |e: &io::Error| e.raw_os_error() == Some(libc::EBUSY);
        if !busy(&error) {
            return Err(error);
        }
        let start = Instant::now();
        while start.elapsed() < BUSY_RETRY {
            std::thread::sleep(Duration::from_millis(50));
            match self.unmount(UnmountFlags::empty()) {
                Err(e) if busy(&e) => continue,
                unmounted => return unmounted,
            }
        }
        tracing::warn!("{} still busy: detaching it", self.name());
        self.unmount(UnmountFlags::DETACH)
    }

    /// Unmounts it through its place, after checking that the place holds
    /// it: no rename or symbolic link above the place can send the
    /// unmount elsewhere in between, and a mount made on top of ours
    /// since would be its owner's own (who may write our root).
    fn unmount(&self, flags: UnmountFlags) -> io::Result<()> {
        let (point, _) = self.entry()?;
        match unmount(point.fixed(), flags | UnmountFlags::NOFOLLOW) {
            Err(rustix::io::Errno::PERM) if !rustix::process::geteuid().is_root() => {
                fusermount_unmount(&point.path()?)
            }
            unmounted => Ok(unmounted?),
        }
    }
}

/// Unmounts `path` with `fusermount3 -u -z`, as a user who may not call
/// umount(2) (the mount was made by `fusermount3` too) and as libfuse
/// does: `fusermount3` unmounts only a FUSE mount its user made, so the
/// path, looked up again with that user's rights, can lead to no other.
/// Detached (`-z`): the server ends once files still open are closed.
fn fusermount_unmount(path: &Path) -> io::Result<()> {
    let status = std::process::Command::new("fusermount3")
        .args(["-u", "-q", "-z", "--"])
        .arg(path)
        .stdin(std::process::Stdio::null())
        .status()?;
    match status.success() {
        true => Ok(()),
        false => Err(io::Error::other(format!(
            "fusermount3 -u failed ({status})"
        ))),
    }
}

/// A mount served by background threads, unmounted when dropped (for tests
/// and programs embedding the filesystem).
pub struct BackgroundMount {
    session: Option<fuser::BackgroundSession>,
    ours: Arc<OurMount>,
}

impl BackgroundMount {
    /// Mounts `backing` (opened with
    /// [`verityfs::safe_dir::open_dir_following`]) on the directory
    /// `mountpoint` (which must exist; opened with
    /// [`verityfs::safe_dir::open_dir`]) in the background.
    pub fn spawn(backing: &Path, mountpoint: &Path, options: MountOptions) -> io::Result<Self> {
        let backing_dir = open_dir_following(backing, None)?;
        let dir = open_dir(mountpoint, None)?;
        let (path, target) = prepare(&backing_dir, &dir)?;
        let fs = VerityFs::new(backing_dir.into_fd(), backing, options.clone())?;
        let fsname = path.display().to_string();
        let (session, ours) = new_session(Served::new(fs), &fsname, &target, &options, &[])?;
        Ok(BackgroundMount {
            session: Some(session.spawn()?),
            ours,
        })
    }

    /// Mounts the image `fs`, named `name`, on `mountpoint` in the
    /// background (read-only, as [`run_image`] does).
    pub fn spawn_image(
        fs: ImageFs,
        name: &str,
        mountpoint: &Path,
        options: MountOptions,
    ) -> io::Result<Self> {
        let dir = open_dir(mountpoint, None)?;
        let target = Target::new(&dir)?;
        let options = image_options(options);
        let (session, ours) = new_session(fs, name, &target, &options, IMAGE_FORCED)?;
        Ok(BackgroundMount {
            session: Some(session.spawn()?),
            ours,
        })
    }

    /// Unmounts and waits for the serving threads.
    pub fn unmount(mut self) -> io::Result<()> {
        self.end()
    }

    /// Unmounts it, if still mounted, and waits for its server to stop
    /// (unless the mount had to be detached while busy).
    fn end(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // Ours first, checked (see `serve`): fuser then finds the mount gone
        // and only waits for its threads. A mount detached while busy
        // ends when its files are closed: its session is left to end then
        // by itself, rather than waited for or unmounted by name again.
        match self.ours.unmount(UnmountFlags::empty()) {
            Err(e) => {
                let detached = self.ours.unmount_busy(e);
                std::mem::forget(session);
                detached
            }
            Ok(()) => join_without_unmount(session),
        }
    }
}

impl Drop for BackgroundMount {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            tracing::error!("unmounting {} failed: {e}", self.ours.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_the_kernel_tore_down_ends_serving_cleanly() {
        let errno = |e| Err(io::Error::from_raw_os_error(e));
        assert!(ended(errno(libc::ECONNABORTED)).is_ok());
        assert!(ended(Ok(())).is_ok());
        assert_eq!(
            ended(errno(libc::EIO)).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
    }
}
