//! The mounts of this process' namespace, from `/proc/self/mountinfo`.
//! Reading it never touches a filesystem, so it is safe while our own
//! mount is not served yet, or hung.
//!
//! The table is read as bytes: a path in it may be any bytes (another
//! user may mount on a name that is not UTF-8), and one such line must
//! not hide the others. Paths are given back exactly, options (which the
//! kernel writes in ASCII for the filesystems we look at) lossily.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug)]
pub struct MountEntry {
    /// The mount's ID (as statx(2) gives it with `STATX_MNT_ID`).
    pub id: u64,
    /// The device of its superblock, `MAJ:MIN`.
    pub device: String,
    /// The directory of its filesystem at its root (`/` but for bind
    /// mounts).
    pub root: PathBuf,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The mount's own flags (`ro`/`rw`, `nosuid`...).
    pub mount_options: String,
    /// The filesystem type (`fuse.verityfs`).
    pub fstype: String,
    /// What is mounted (a device, or a FUSE filesystem's `fsname`).
    pub source: OsString,
    /// The superblock's options (`ro`/`rw` first).
    pub super_options: String,
}

impl MountEntry {
    /// Read-only, as a mount or as a filesystem (`mount -o remount,ro`
    /// sets both; a read-only bind mount only the first).
    pub fn read_only(&self) -> bool {
        let ro = |options: &str| options.split(',').any(|o| o == "ro");
        ro(&self.mount_options) || ro(&self.super_options)
    }
}

/// All mounts, in mount order.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    let table = std::fs::read("/proc/self/mountinfo")?;
    Ok(table.split(|&b| b == b'\n').filter_map(parse).collect())
}

/// The mount on `point` (the last one, which hides the others).
pub fn mount_on(point: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().rfind(|m| m.point == point))
}

/// The mount of ID `id`.
pub fn mount_of_id(id: u64) -> io::Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().find(|m| m.id == id))
}

/// One line: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE
/// SOURCE SUPER_OPTIONS`.
fn parse(line: &[u8]) -> Option<MountEntry> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let dash = fields.iter().skip(6).position(|f| *f == b"-")? + 6;
    let text = |f: &[u8]| String::from_utf8_lossy(f).into_owned();
    let fs = fields.get(dash + 1..dash + 4)?;
    Some(MountEntry {
        id: text(fields[0]).parse().ok()?,
        device: text(fields[2]),
        root: PathBuf::from(unescape(fields[3])),
        point: PathBuf::from(unescape(fields[4])),
        mount_options: text(fields[5]),
        fstype: text(fs[0]),
        source: unescape(fs[1]),
        super_options: text(fs[2]),
    })
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011` tab,
/// `\012` newline, `\134` backslash); a backslash not followed by three
/// octal digits stays as it is.
fn unescape(field: &[u8]) -> OsString {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&b, tail)) = rest.split_first() {
        let octal = tail.get(..3).and_then(|d| {
            d.iter()
                .all(|c| (b'0'..=b'7').contains(c))
                .then(|| d.iter().fold(0u32, |n, c| n * 8 + u32::from(c - b'0')))
        });
        match (b, octal.and_then(|n| u8::try_from(n).ok())) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                rest = &tail[3..];
            }
            _ => {
                out.push(b);
                rest = tail;
            }
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn parses_a_line() {
        let line =
            b"45 27 0:40 / /tmp/a\\040b ro,nosuid shared:7 - fuse.verityfs /srv/b rw,user_id=0";
        let m = parse(line).unwrap();
        assert_eq!((m.id, m.device.as_str()), (45, "0:40"));
        assert_eq!(m.root, Path::new("/"));
        assert_eq!(m.point, Path::new("/tmp/a b"));
        assert_eq!(m.fstype, "fuse.verityfs");
        assert_eq!(m.source, "/srv/b");
        assert!(m.read_only());
        assert!(parse(b"45 27 0:40 / /x rw").is_none());
        assert!(parse(b"").is_none());
    }

    #[test]
    fn paths_are_bytes() {
        let line = b"45 27 0:40 /\xfe /t/\xff\\012\\011\\134 rw - tmpfs t\\054 rw";
        let m = parse(line).unwrap();
        assert_eq!(m.root.as_os_str().as_bytes(), b"/\xfe");
        assert_eq!(m.point.as_os_str().as_bytes(), b"/t/\xff\n\t\\");
        assert_eq!(m.source.as_bytes(), b"t,");
        assert_eq!(unescape(b"a\\134b\\").as_bytes(), b"a\\b\\");
        assert_eq!(unescape(b"/x\\0").as_bytes(), b"/x\\0");
        assert_eq!(unescape(b"/x\\777").as_bytes(), b"/x\\777");
    }

    #[test]
    fn the_root_is_mounted() {
        assert!(mount_on(Path::new("/")).unwrap().is_some());
    }
}
