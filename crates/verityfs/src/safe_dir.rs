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
//!   (`ELOOP`, as `O_NOFOLLOW` gives);
//! - a symbolic link before it is followed only if it belongs to root or
//!   to the effective user: a link can be changed only by replacing it,
//!   which makes the replacement belong to whoever made it, so a link of
//!   root's or our own is one that someone we trust put there (system
//!   links such as `/var/run -> /run`); anyone else's is refused
//!   (`ELOOP`). The owner is read from the link itself and its target
//!   through the same descriptor, so the link checked is the link read;
//! - a missing component is created (if asked) with `mkdirat` relative to
//!   its parent's descriptor, then opened as above: never through a name
//!   that could lead elsewhere.
//!
//! Directories on the way are taken as they are, whoever owns them: a user
//! who can write one can only put there what they could reach anyway (a
//! directory of their own), since without a link of theirs being followed
//! the walk cannot leave the directories that are really on the path.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use rustix::io::Errno;

/// The most symbolic links followed in one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

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
/// missing components with mode `create` (less the umask) if given.
/// Errors name the path and, for a refused link or a non-directory, the
/// component, with the kernel's errno: `ELOOP` for a refused link,
/// `ENOTDIR`, `ENOENT`, or that of the failed call.
pub fn open_dir(path: &Path, create: Option<u32>) -> io::Result<OpenedDir> {
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
    let mut fd = rustix::fs::openat(CWD, ".", LOOKUP | OFlags::DIRECTORY, Mode::empty())?;
    let mut walked = PathBuf::new();
    let mut made = None;
    let mut links = 0;
    let mut steps = steps(path);
    while let Some(step) = steps.pop() {
        let name = match step {
            Step::Root => {
                fd = rustix::fs::openat(CWD, "/", LOOKUP | OFlags::DIRECTORY, Mode::empty())?;
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
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                let parent = std::mem::replace(&mut fd, child);
                made = (created && last).then(|| Made {
                    parent,
                    name,
                    ino: st.st_ino,
                });
            }
            FileType::Symlink if last => {
                return Err(fail(
                    &walked,
                    Errno::LOOP,
                    " is a symbolic link, not followed",
                ))
            }
            FileType::Symlink if st.st_uid != 0 && st.st_uid != euid => {
                let trusted = match euid {
                    0 => "root's".to_owned(),
                    uid => format!("root's or uid {uid}'s"),
                };
                let why = format!(
                    " is a symbolic link of uid {}, not followed (only links of {trusted} are)",
                    st.st_uid
                );
                return Err(fail(&walked, Errno::LOOP, &why));
            }
            FileType::Symlink => {
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

/// Opens `name` in the directory `dir` without following it; if it is
/// missing and `create` is given, creates it as a directory first. Returns
/// whether it did.
fn open_child(dir: &OwnedFd, name: &OsStr, create: Option<u32>) -> Result<(OwnedFd, bool), Errno> {
    match (rustix::fs::openat(dir, name, LOOKUP, Mode::empty()), create) {
        (Err(Errno::NOENT), Some(mode)) => {
            let created = match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)) {
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
    use std::os::unix::fs::symlink;

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
}
