//! Opening a directory named by a path that other users may be able to
//! change: a mount point, a cache directory. A daemon running as root must
//! not be sent elsewhere by a user who can write a directory on the way.
//!
//! The path is walked one component at a time, each opened with
//! `O_PATH | O_NOFOLLOW` relative to the directory before it, so that the
//! result is one descriptor of one directory, and whatever happens to the
//! names afterwards (renames, symlinks swapped in) cannot change which
//! directory it is. Along the way:
//!
//! - the last component is never followed if it is a symbolic link
//!   (`ELOOP`, as `O_NOFOLLOW` gives): a directory to mount on must be
//!   the one named. [`open_dir_following`], for a directory to serve,
//!   follows it under the rule of the others;
//! - a symbolic link before it is followed only if it belongs to root or
//!   to the effective user: a link can be changed only by replacing it,
//!   which makes the replacement belong to whoever made it, so a link of
//!   root's or our own is one that someone we trust put there (system
//!   links such as `/var/run -> /run`); anyone else's is refused
//!   (`ELOOP`). The owner is read from the link itself and its target
//!   through the same descriptor, so the link checked is the link read;
//! - a link's owner says who made it, not who put it where it is: a link
//!   of root's can be moved out of a directory a user can write, or hard
//!   linked (without `fs.protected_hardlinks`), into that user's
//!   directory. So, as systemd does for its `CHASE_SAFE` lookups, a step
//!   from a directory that belongs to someone other than root or the
//!   effective user is refused (`EPERM`) unless what it leads to (an
//!   entry, a link, or `..`) belongs to that same someone: what a user's
//!   directory holds is trusted only as far as that user is. Root's
//!   directories in a user's directory are refused too, although only
//!   root can have put them there when they are not writable by that
//!   user (moving a directory to another parent needs write access to
//!   it): the rule stays simple, and a user's directory holds directories
//!   of theirs;
//! - a link on a FUSE filesystem, whose daemon says who owns what, is
//!   followed only on a mount of root's or the effective user's (its
//!   `user_id` in `/proc/self/mountinfo`, found by the link's mount ID);
//! - a missing component is created (if asked) with `mkdirat` relative to
//!   its parent's descriptor, with mode 0755 at most (less the umask),
//!   then opened as above: never through a name that could lead
//!   elsewhere.
//!
//! Directories of root's or the effective user's are taken as they are,
//! even if others can write them: such a user can only put there what
//! they could reach anyway (entries of their own, refused by the rules
//! above as soon as the walk would leave them).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, StatxFlags, CWD};
use rustix::io::Errno;

/// The most symbolic links followed in one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// statfs(2)'s `f_type` of FUSE filesystems.
const FUSE_SUPER_MAGIC: rustix::fs::FsWord = 0x6573_5546;

/// The mode of the directories made, at most (the umask applies).
const MADE_MODE: u32 = 0o755;

/// How each component is opened: the object itself, never what a link
/// points to.
const LOOKUP: OFlags = OFlags::PATH.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// A directory opened by [`open_dir`].
#[derive(Debug)]
pub struct OpenedDir {
    fd: OwnedFd,
    /// Set if the last component was created by the walk: its parent, its
    /// name there, and its inode.
    made: Option<Made>,
}

#[derive(Debug)]
struct Made {
    parent: OwnedFd,
    name: OsString,
    ino: u64,
}

impl OpenedDir {
    /// The directory, as an `O_PATH` descriptor: a base for `openat`, or
    /// `/proc/self/fd/N` for system calls that take only a path.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The directory's descriptor, for keeping.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Whether the walk created the directory.
    pub fn made(&self) -> bool {
        self.made.is_some()
    }

    /// The path the kernel gives the directory now (no symbolic links, no
    /// `..`), for messages and the mount table.
    pub fn path(&self) -> io::Result<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Removes the directory if the walk created it and it is still there
    /// under the name it was given, empty (to undo a failed use of it).
    pub fn remove_if_made(&self) -> io::Result<()> {
        let Some(made) = &self.made else {
            return Ok(());
        };
        let st = rustix::fs::statat(&made.parent, &made.name, AtFlags::SYMLINK_NOFOLLOW)?;
        if st.st_ino != made.ino {
            return Ok(());
        }
        Ok(rustix::fs::unlinkat(
            &made.parent,
            &made.name,
            AtFlags::REMOVEDIR,
        )?)
    }
}

/// Why [`open_dir`] failed: the message, and the errno the kernel gives
/// for it (as the source of the `io::Error` it returns).
#[derive(Debug)]
pub struct PathError {
    errno: Errno,
    message: String,
}

impl PathError {
    /// The errno of the failure (`ELOOP` for a refused link, `ENOTDIR`...).
    pub fn errno(&self) -> i32 {
        self.errno.raw_os_error()
    }

    /// The errno of `e` if [`open_dir`] returned it.
    pub fn errno_of(e: &io::Error) -> Option<i32> {
        let inner = e.get_ref()?.downcast_ref::<PathError>()?;
        Some(inner.errno())
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = io::Error::from(self.errno);
        let text = text.to_string();
        // "Not a directory (os error 20)": the errno is part of the error.
        let text = text.split(" (os error").next().unwrap_or(&text);
        write!(f, "{}: {text}", self.message)
    }
}

impl std::error::Error for PathError {}

/// A component still to walk.
enum Step {
    Root,
    Parent,
    Name(OsString),
}

/// The steps of `path`, in reverse order (the next one last).
fn steps(path: &Path) -> Vec<Step> {
    let mut steps: Vec<Step> = path
        .components()
        .filter_map(|c| match c {
            Component::RootDir => Some(Step::Root),
            Component::ParentDir => Some(Step::Parent),
            Component::Normal(name) => Some(Step::Name(name.to_owned())),
            Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    steps.reverse();
    steps
}

/// Opens the directory `path` under the rules of this module, creating
/// missing components with mode `create` (less the umask, and never more
/// than 0755) if given.
/// Errors name the path and, for a refused link or a non-directory, the
/// component, with the kernel's errno: `ELOOP` for a refused link,
/// `ENOTDIR`, `ENOENT`, or that of the failed call.
pub fn open_dir(path: &Path, create: Option<u32>) -> io::Result<OpenedDir> {
    walk(path, create, false)
}

/// [`open_dir`], except that a symbolic link as the last component is
/// followed under the rules of the others (root's or the effective user's
/// links only, and so on): for a directory whose contents are used, such
/// as a backing directory, where a link to it, of the system's or of the
/// user's own, is what its administrator means.
pub fn open_dir_following(path: &Path, create: Option<u32>) -> io::Result<OpenedDir> {
    walk(path, create, true)
}

/// Walks `path` as [`open_dir`] says, following a final symbolic link if
/// `follow_last`.
fn walk(path: &Path, create: Option<u32>, follow_last: bool) -> io::Result<OpenedDir> {
    let fail = |walked: &Path, errno: Errno, why: &str| {
        let detail = if walked == path || why.is_empty() {
            String::new()
        } else {
            format!(": '{}'", walked.display())
        };
        let message = format!("'{}'{detail}{why}", path.display());
        io::Error::new(io::Error::from(errno).kind(), PathError { errno, message })
    };
    if path.as_os_str().is_empty() {
        return Err(fail(path, Errno::NOENT, ""));
    }
    let euid = rustix::process::geteuid().as_raw();
    let trusted = match euid {
        0 => "root's".to_owned(),
        uid => format!("root's or uid {uid}'s"),
    };
    let mut fd = rustix::fs::openat(CWD, ".", LOOKUP | OFlags::DIRECTORY, Mode::empty())?;
    // The owner of the directory `fd` is.
    let mut owner = rustix::fs::fstat(&fd)?.st_uid;
    let mut walked = PathBuf::new();
    let mut made = None;
    let mut links = 0;
    let mut steps = steps(path);
    while let Some(step) = steps.pop() {
        let name = match step {
            Step::Root => {
                fd = rustix::fs::openat(CWD, "/", LOOKUP | OFlags::DIRECTORY, Mode::empty())?;
                owner = rustix::fs::fstat(&fd)?.st_uid;
                walked = PathBuf::from("/");
                continue;
            }
            Step::Parent => OsString::from(".."),
            Step::Name(name) => name,
        };
        walked.push(&name);
        let last = steps.is_empty();
        let (child, created) = open_child(&fd, &name, create).map_err(|e| fail(&walked, e, ""))?;
        let st = rustix::fs::fstat(&child).map_err(|e| fail(&walked, e, ""))?;
        if owner != 0 && owner != euid && st.st_uid != owner {
            let why = format!(
                " belongs to uid {}, in a directory of uid {owner}: not followed (from a \
                 directory that is not {trusted}, only entries of its owner are)",
                st.st_uid
            );
            return Err(fail(&walked, Errno::PERM, &why));
        }
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                owner = st.st_uid;
                let parent = std::mem::replace(&mut fd, child);
                made = (created && last).then(|| Made {
                    parent,
                    name,
                    ino: st.st_ino,
                });
            }
            FileType::Symlink if last && !follow_last => {
                return Err(fail(
                    &walked,
                    Errno::LOOP,
                    " is a symbolic link, not followed",
                ))
            }
            FileType::Symlink if st.st_uid != 0 && st.st_uid != euid => {
                let why = format!(
                    " is a symbolic link of uid {}, not followed (only links of {trusted} are)",
                    st.st_uid
                );
                return Err(fail(&walked, Errno::LOOP, &why));
            }
            FileType::Symlink => {
                if let Some(mount_owner) =
                    foreign_fuse(&child, euid).map_err(|e| fail(&walked, e, ""))?
                {
                    let why = format!(
                        " is a symbolic link on a FUSE mount of {mount_owner}, not followed \
                         (only links on mounts of {trusted} are)"
                    );
                    return Err(fail(&walked, Errno::LOOP, &why));
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(fail(&walked, Errno::LOOP, ""));
                }
                // The target of the very link whose owner was checked.
                let target = rustix::fs::readlinkat(&child, "", Vec::new())
                    .map_err(|e| fail(&walked, e, ""))?;
                walked.pop();
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                steps.extend(self::steps(&target));
            }
            _ => return Err(fail(&walked, Errno::NOTDIR, "")),
        }
    }
    Ok(OpenedDir { fd, made })
}

/// If `link` is on a FUSE mount of someone other than root and `euid`
/// (whose daemon may give its files any owner), that someone: `uid N`,
/// or `an unknown user` if the mount is not found.
fn foreign_fuse(link: &OwnedFd, euid: u32) -> Result<Option<String>, Errno> {
    if rustix::fs::fstatfs(link)?.f_type != FUSE_SUPER_MAGIC {
        return Ok(None);
    }
    let flags = AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW;
    let id = rustix::fs::statx(link, "", flags, StatxFlags::MNT_ID)?.stx_mnt_id;
    let mount = crate::mountinfo::mount_of_id(id).ok().flatten();
    let user = mount.and_then(|m| {
        let options = m.super_options.split(',');
        options
            .filter_map(|o| o.strip_prefix("user_id=")?.parse::<u32>().ok())
            .next()
    });
    Ok(match user {
        Some(uid) if uid == 0 || uid == euid => None,
        Some(uid) => Some(format!("uid {uid}")),
        None => Some("an unknown user".to_owned()),
    })
}

/// Opens `name` in the directory `dir` without following it; if it is
/// missing and `create` is given, creates it as a directory first. Returns
/// whether it did.
fn open_child(dir: &OwnedFd, name: &OsStr, create: Option<u32>) -> Result<(OwnedFd, bool), Errno> {
    match (rustix::fs::openat(dir, name, LOOKUP, Mode::empty()), create) {
        (Err(Errno::NOENT), Some(mode)) => {
            let mode = Mode::from_raw_mode(mode & MADE_MODE);
            let created = match rustix::fs::mkdirat(dir, name, mode) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(e),
            };
            let child = rustix::fs::openat(dir, name, LOOKUP, Mode::empty())?;
            Ok((child, created))
        }
        (opened, _) => Ok((opened?, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn errno(e: &io::Error) -> i32 {
        PathError::errno_of(e).unwrap()
    }

    /// Gives `path` (not followed) to `uid`.
    fn give(path: &Path, uid: u32) {
        let uid = rustix::fs::Uid::from_raw(uid);
        rustix::fs::chownat(CWD, path, Some(uid), None, AtFlags::SYMLINK_NOFOLLOW)
            .expect("giving a link to another user (the tests run as root)");
    }

    #[test]
    fn a_final_symlink_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        symlink(&target, dir.path().join("link")).unwrap();
        let e = open_dir(&dir.path().join("link"), Some(0o755)).unwrap_err();
        assert_eq!(errno(&e), libc::ELOOP, "{e}");
        assert!(
            e.to_string().contains("is a symbolic link, not followed"),
            "{e}"
        );
    }

    #[test]
    fn a_final_symlink_is_followed_on_request_under_the_same_rules() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = dir.path().join("link");
        symlink(&target, &link).unwrap();
        let opened = open_dir_following(&link, None).unwrap();
        assert_eq!(opened.path().unwrap(), target);
        give(&link, 65534);
        let e = open_dir_following(&link, None).unwrap_err();
        assert_eq!(errno(&e), libc::ELOOP, "{e}");
        assert!(e.to_string().contains("symbolic link of uid 65534"), "{e}");
    }

    #[test]
    fn links_of_root_or_ours_are_followed_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        let link = dir.path().join("link");
        symlink(&victim, &link).unwrap();
        let opened = open_dir(&link.join("a/b"), Some(0o755)).unwrap();
        assert!(opened.made());
        assert_eq!(opened.path().unwrap(), victim.join("a/b"));
        // The same link, owned by someone else: refused, nothing made.
        give(&link, 65534);
        let e = open_dir(&link.join("c"), Some(0o755)).unwrap_err();
        assert_eq!(errno(&e), libc::ELOOP);
        assert!(e.to_string().contains("symbolic link of uid 65534"), "{e}");
        assert!(!victim.join("c").exists());
    }

    #[test]
    fn relative_paths_dots_and_non_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let up = dir.path().join("d/../d/./");
        assert_eq!(
            open_dir(&up, None).unwrap().path().unwrap(),
            dir.path().join("d")
        );
        let e = open_dir(&dir.path().join("f/x"), Some(0o755)).unwrap_err();
        assert_eq!(errno(&e), libc::ENOTDIR, "{e}");
        let e = open_dir(&dir.path().join("missing"), None).unwrap_err();
        assert_eq!(errno(&e), libc::ENOENT, "{e}");
        let e = open_dir(Path::new(""), None).unwrap_err();
        assert_eq!(errno(&e), libc::ENOENT, "{e}");
    }

    #[test]
    fn a_loop_of_links_ends() {
        let dir = tempfile::tempdir().unwrap();
        symlink("b", dir.path().join("a")).unwrap();
        symlink("a", dir.path().join("b")).unwrap();
        let e = open_dir(&dir.path().join("a/x"), None).unwrap_err();
        assert_eq!(errno(&e), libc::ELOOP, "{e}");
    }

    #[test]
    fn only_a_directory_it_made_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let made = open_dir(&dir.path().join("new"), Some(0o700)).unwrap();
        let existing = open_dir(dir.path(), Some(0o700)).unwrap();
        assert!(!existing.made());
        existing.remove_if_made().unwrap();
        assert!(dir.path().exists());
        // Replaced by another directory under the same name: kept.
        std::fs::remove_dir(dir.path().join("new")).unwrap();
        std::fs::create_dir(dir.path().join("new")).unwrap();
        made.remove_if_made().unwrap();
        assert!(dir.path().join("new").exists());
        let made = open_dir(&dir.path().join("other"), Some(0o700)).unwrap();
        made.remove_if_made().unwrap();
        assert!(!dir.path().join("other").exists());
    }

    /// A directory in `dir` that belongs to `nobody`.
    fn nobody_s(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir(&path).unwrap();
        give(&path, 65534);
        path
    }

    #[test]
    fn root_s_link_moved_into_another_user_s_directory_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::create_dir(&victim).unwrap();
        let attacker = nobody_s(dir.path(), "attacker");
        // Made by root, then moved where nobody put it.
        symlink(&victim, dir.path().join("link")).unwrap();
        std::fs::rename(dir.path().join("link"), attacker.join("link")).unwrap();
        let e = open_dir(&attacker.join("link/x"), Some(0o755)).unwrap_err();
        assert_eq!(errno(&e), libc::EPERM, "{e}");
        let want = format!(
            "'{}' belongs to uid 0, in a directory of uid 65534: not followed",
            attacker.join("link").display()
        );
        assert!(e.to_string().contains(&want), "{e}");
        assert!(!victim.join("x").exists());
    }

    #[test]
    fn from_another_user_s_directory_only_their_entries_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        // As /tmp: root's, sticky, everyone's to write.
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let home = nobody_s(&tmp, "home");
        let theirs = nobody_s(&home, "theirs");
        assert_eq!(open_dir(&theirs, None).unwrap().path().unwrap(), theirs);
        // A directory of root's in it, and `..` out of it.
        std::fs::create_dir(home.join("root-s")).unwrap();
        for path in [home.join("root-s"), theirs.join("../../tmp")] {
            let e = open_dir(&path, None).unwrap_err();
            assert_eq!(errno(&e), libc::EPERM, "{e}");
            assert!(
                e.to_string()
                    .contains("belongs to uid 0, in a directory of uid 65534"),
                "{e}"
            );
        }
        // Nor anything made there: root's too.
        let e = open_dir(&home.join("new/dir"), Some(0o755)).unwrap_err();
        assert_eq!(errno(&e), libc::EPERM, "{e}");
    }

    #[test]
    fn directories_are_made_0755_at_most() {
        let dir = tempfile::tempdir().unwrap();
        let old = rustix::process::umask(Mode::empty());
        let made = open_dir(&dir.path().join("a/b"), Some(0o777));
        rustix::process::umask(old);
        made.unwrap();
        for path in ["a", "a/b"] {
            let mode = std::fs::metadata(dir.path().join(path))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o7777, 0o755, "{path}");
        }
    }
}
