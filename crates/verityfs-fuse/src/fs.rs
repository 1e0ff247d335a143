//! The filesystem's state and the helpers every operation uses: finding
//! inodes, attributes with verity sizes, opening backing files.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo};
use rustix::fs::{Mode, OFlags, Stat, CWD};
use verityfs::{FileState, ReadOptions, Verifier, VerityFile};

use crate::attr::to_file_attr;
use crate::caller::Caller;
use crate::creds::Creds;
use crate::handles::HandleTable;
use crate::inodes::{errno, CachedPages, Inode, InodeTable, VerityGuard, VerityState};
use crate::invalidate::Invalidator;
use crate::policy::SignaturePolicy;

/// Settings of a mount.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Refuse every change (mounted `ro`; enable gives `EROFS`).
    pub read_only: bool,
    /// Let other users than the mounter use the filesystem.
    pub allow_other: bool,
    /// Verified read path settings (readahead, cache size).
    pub read: ReadOptions,
    /// FUSE worker threads.
    pub threads: usize,
    /// Built-in signature policy.
    pub signatures: SignaturePolicy,
    /// Further options for the kernel and fusermount3, as mount(8) takes
    /// them (`noexec`, `fsname=NAME`, `auto_unmount`...; see
    /// [`crate::accepts_mount_option`]).
    pub mount_options: Vec<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            allow_other: false,
            read: ReadOptions::default(),
            threads: 4,
            signatures: SignaturePolicy::default(),
            mount_options: Vec::new(),
        }
    }
}

/// A verityfs filesystem over a backing directory.
pub struct VerityFs {
    pub(crate) inodes: InodeTable,
    pub(crate) handles: HandleTable,
    pub(crate) verifier: Arc<Verifier>,
    pub(crate) options: MountOptions,
    pub(crate) invalidator: Arc<Invalidator>,
    /// The daemon runs as root: requests run with their callers'
    /// credentials.
    pub(crate) switch_creds: bool,
    /// The mount, once mounted.
    pub(crate) mount: Arc<crate::mount::MountState>,
}

impl VerityFs {
    /// A filesystem over the backing directory `root` (an `O_PATH`
    /// descriptor), named `backing` in messages. Fails clearly if the
    /// backing filesystem cannot hold verity files (no user extended
    /// attributes).
    pub fn new(root: OwnedFd, backing: &Path, options: MountOptions) -> io::Result<Self> {
        if !options.read_only {
            probe_xattrs(&root, backing)?;
        }
        Ok(VerityFs {
            inodes: InodeTable::new(root).map_err(|e| io::Error::from_raw_os_error(e.code()))?,
            handles: HandleTable::default(),
            verifier: Verifier::new(options.read),
            options,
            invalidator: Arc::new(Invalidator::new()),
            switch_creds: crate::creds::can_switch(),
            mount: Arc::default(),
        })
    }

    /// Looks `name` up in `parent`, taking a kernel reference to it.
    pub(crate) fn lookup_child(
        &self,
        parent: &Inode,
        name: &OsStr,
    ) -> Result<(Arc<Inode>, FileAttr), Errno> {
        let fd = rustix::fs::openat(
            parent.fd.as_fd(),
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        let st = rustix::fs::fstat(&fd).map_err(errno)?;
        let inode = self.inodes.insert(fd, &st);
        let attr = self.attr_with_stat(&inode, &st)?;
        Ok((inode, attr))
    }

    /// The attributes of `inode` as users see them.
    pub(crate) fn attr(&self, inode: &Arc<Inode>) -> Result<FileAttr, Errno> {
        self.attr_with_stat(inode, &inode.stat()?)
    }

    fn attr_with_stat(&self, inode: &Arc<Inode>, st: &Stat) -> Result<FileAttr, Errno> {
        let backing_size = st.st_size as u64;
        if inode.kind != FileType::RegularFile {
            return Ok(to_file_attr(inode.ino, st, backing_size));
        }
        let mut verity = inode.verity();
        let size = match &verity.file {
            Some(file) => file.data_size(),
            // A damaged record is reported when the file is opened.
            None => match self.state(inode, &mut verity) {
                Ok(state @ FileState::Verity(_)) => {
                    // Made verity behind our back after the kernel saw it
                    // ordinary: its cached pages go now. Else it is opened
                    // at its first open, as the kernel reads the descriptor
                    // then: `stat`, `ls -l` and `find` read nothing of it.
                    let switched = match verity.shown_plain {
                        true => self.become_verity(inode, &mut verity).ok(),
                        false => None,
                    };
                    // The switched file's size, if its record changed since.
                    switched.map_or(state.logical_size(backing_size), |f| f.data_size())
                }
                Ok(state) => {
                    verity.shown_plain = true;
                    state.logical_size(backing_size)
                }
                Err(_) => {
                    verity.shown_plain = true;
                    backing_size
                }
            },
        };
        // Switched meanwhile by another request (`state` may unlock): the
        // verity file's size, the one the switch compared.
        let size = verity.file.as_ref().map_or(size, |file| file.data_size());
        // Under the same lock as the switch, which compares it.
        verity.shown_size.show(size);
        Ok(to_file_attr(inode.ino, st, size))
    }

    /// The verity state of a regular file as its records say.
    fn recorded_state(&self, inode: &Inode) -> Result<FileState, Errno> {
        FileState::read_path(&inode.proc_path()).map_err(lib_errno)
    }

    /// The verity state of a regular file as found, undoing an enable that
    /// was interrupted (a crash, or a kill of another daemon) on the way:
    /// at lookups, and before anything changes the file's data (a writer's
    /// open, a truncation, an enable). Reads need not (they stop at the
    /// logical size), and must not (see below). The state returned for an
    /// undone enable is still `Enabling`: its logical size is the size the
    /// file has once undone, whatever the caller's earlier `stat` said.
    ///
    /// The undoing truncates the backing file, which waits for its inode's
    /// lock: it runs unlocked (see `VerityState`), marked as an enable
    /// running, so that writers and enables meanwhile get `ETXTBSY` and
    /// `EBUSY` as during one, and no other request waits for it.
    pub(crate) fn state(
        &self,
        inode: &Inode,
        verity: &mut VerityGuard<'_>,
    ) -> Result<FileState, Errno> {
        let state = self.recorded_state(inode)?;
        if let FileState::Enabling(_) = state {
            if !verity.enabling && !self.options.read_only {
                verity.enabling = true;
                let undone = VerityGuard::unlocked(verity, || {
                    let file = self.open_backing(inode, OFlags::RDWR)?;
                    verityfs::recover(&file).map_err(lib_errno)
                });
                verity.enabling = false;
                undone?;
            }
        }
        Ok(state)
    }

    /// The open verity file of `inode` if it is one (opened once, shared).
    /// Every request that cares looks here, so that a file made verity in
    /// the backing store, behind the daemon's back, is seen as verity from
    /// the first request that meets it: lookup, getattr, open, reads through
    /// handles opened before, the ioctls.
    pub(crate) fn verity_file(
        &self,
        inode: &Arc<Inode>,
        verity: &mut VerityState,
    ) -> Result<Option<Arc<VerityFile>>, Errno> {
        if let Some(file) = &verity.file {
            return Ok(Some(file.clone()));
        }
        if !self.recorded_state(inode)?.is_verity() {
            return Ok(None);
        }
        self.become_verity(inode, verity).map(Some)
    }

    /// Opens the verity file of `inode`, which just became one as far as
    /// this daemon knows, and drops whatever the kernel cached of it before.
    fn become_verity(
        &self,
        inode: &Arc<Inode>,
        verity: &mut VerityState,
    ) -> Result<Arc<VerityFile>, Errno> {
        let backing = self.open_backing(inode, OFlags::RDONLY)?;
        // The backing path as of now, for messages (the file may be renamed).
        let name = std::fs::read_link(inode.proc_path()).unwrap_or_else(|_| inode.proc_path());
        let file = VerityFile::open(&self.verifier, backing, &name).map_err(lib_errno)?;
        // As the kernel at inode open: a signature must verify, and unsigned
        // files are refused when signatures are required.
        let policy = &self.options.signatures;
        policy
            .check(file.descriptor(), file.signature())
            .map_err(|e| Errno::from_i32(e.errno()))?;
        let file = Arc::new(file);
        verity.file = Some(file.clone());
        // Pages cached while the file was ordinary were never verified: the
        // notification drops them, for mappings and descriptors already
        // open, and until it is done every open drops them too (no
        // FOPEN_KEEP_CACHE). It also drops the attributes, which cost a
        // GETATTR on the next access: it is sent only if the kernel was
        // ever shown the file as ordinary.
        verity.cache_verified = true;
        // A size shown before (an ordinary file's, or from a location
        // record changed since) would cut reads short, of a file whose
        // measure is the whole one's: it is dropped before any reply.
        if verity.shown_size.other_than(file.data_size()) {
            self.invalidator.invalidate_attributes(inode.ino);
        }
        if verity.shown_plain {
            self.invalidator.invalidate(inode.clone(), verity);
        }
        // Handles opened for writing before can still put bytes in this
        // inode's page cache (the kernel copies a write(2) or a store to a
        // shared mapping into the page before the daemon can refuse it):
        // new opens get a fresh inode instead.
        if verity.writers > 0 {
            self.inodes.retire(inode);
        }
        Ok(file)
    }

    /// Sends `result` with `send` (the reply to a request about the handle
    /// `fh`) once the kernel can show nothing of the file that the daemon
    /// did not verify: at once, or after the drop under way (see
    /// `invalidate`). A file whose old pages writers can still change is
    /// not called verity meanwhile (`ETXTBSY`, as the kernel refuses an
    /// enable while the file is open for writing), and a retired inode,
    /// which they could change, never again (`ESTALE`, as its opens).
    pub(crate) fn reply_when_verified<T: Send + 'static>(
        &self,
        fh: FileHandle,
        result: Result<T, Errno>,
        send: impl FnOnce(Result<T, Errno>) + Send + 'static,
    ) {
        let Ok(handle) = self.handles.get(fh) else {
            return send(result);
        };
        let inode = handle.inode();
        if inode.is_retired() {
            return send(Err(Errno::from_i32(libc::ESTALE)));
        }
        match inode.cached_pages() {
            CachedPages::Verified => send(result),
            CachedPages::Dropping => self.invalidator.after_drops(move || send(result)),
            CachedPages::Writable if inode.verity().file.is_some() => {
                send(Err(Errno::from_i32(libc::ETXTBSY)))
            }
            CachedPages::Writable => send(result),
        }
    }

    /// Opens the backing object of `inode` with `flags`, never waiting (see
    /// [`NEVER_WAIT`]).
    pub(crate) fn open_backing(&self, inode: &Inode, flags: OFlags) -> Result<File, Errno> {
        let fd: OwnedFd = rustix::fs::openat(
            CWD,
            inode.proc_path(),
            flags | OFlags::CLOEXEC | NEVER_WAIT,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(File::from(fd))
    }

    /// Runs `f` with the credentials of `caller` (see `creds`): every
    /// change to the backing store made on a user's behalf goes through
    /// here.
    pub(crate) fn as_caller<T>(
        &self,
        caller: &Caller,
        f: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        self.with_creds(&Creds::of(caller), f)
    }

    /// Runs `f` with `creds`.
    pub(crate) fn with_creds<T>(
        &self,
        creds: &Creds,
        f: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        crate::creds::run_as(self.switch_creds, creds, f)
    }

    /// The inode `ino`.
    pub(crate) fn inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        self.inodes.get(ino)
    }
}

/// Added to every open of a backing file: whoever writes the backing store
/// may hold a lease on a file there, and an open that breaks it would wait
/// for the holder (45 s by default), holding a worker thread and the
/// inode's lock meanwhile; with it, the open fails at once (`EAGAIN`).
/// Regular files ignore it otherwise.
pub(crate) const NEVER_WAIT: OFlags = OFlags::NONBLOCK;

/// A library error as a FUSE errno.
pub(crate) fn lib_errno(e: verityfs::Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// A new file in the directory `root` that no name refers to: an unnamed
/// `O_TMPFILE`, or where the filesystem has none, a new name made with
/// `O_EXCL | O_NOFOLLOW` and removed at once. Never an object someone put
/// in the directory (a planted symbolic link, say).
fn scratch_file(root: &OwnedFd) -> rustix::io::Result<OwnedFd> {
    let mode = Mode::from_raw_mode(0o600);
    let tmpfile = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
    match rustix::fs::openat(root, ".", tmpfile, mode) {
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR) => {}
        other => return other,
    }
    let name = format!(".verityfs-probe-{}", std::process::id());
    let flags = OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::RDWR | OFlags::CLOEXEC;
    let file = rustix::fs::openat(root, &name, flags, mode)?;
    rustix::fs::unlinkat(root, &name, rustix::fs::AtFlags::empty())?;
    Ok(file)
}

/// Checks that the backing filesystem keeps user extended attributes, which
/// the layout needs, by setting one on a scratch file.
fn probe_xattrs(root: &OwnedFd, backing: &Path) -> io::Result<()> {
    let cannot = |e: rustix::io::Errno| {
        let why = format!("'{}': can't create a file in it: {e}", backing.display());
        io::Error::new(io::Error::from(e).kind(), why)
    };
    let file = File::from(scratch_file(root).map_err(cannot)?);
    let result = rustix::fs::fsetxattr(
        &file,
        "user.verityfs.probe",
        b"1",
        rustix::fs::XattrFlags::empty(),
    );
    result.map_err(|e| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: the backing filesystem does not support user extended attributes ({e}), \
                 which verity files need",
                backing.display()
            ),
        )
    })
}
