//! The mounts of this process' namespace, from `/proc/self/mountinfo`.
//! Reading it never touches a filesystem, so it is safe while our own
//! mount is not served yet, or hung.

use std::io;
use std::path::{Path, PathBuf};

/// One mount.
pub struct MountEntry {
    /// The device of its superblock, `MAJ:MIN`.
    pub device: String,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The mount's own flags (`ro`/`rw`, `nosuid`...).
    pub mount_options: String,
    /// The filesystem type (`fuse.verityfs`).
    pub fstype: String,
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
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse).collect())
}

/// The mount on `point` (the last one, which hides the others).
pub fn mount_on(point: &Path) -> io::Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().rfind(|m| m.point == point))
}

fn parse(line: &str) -> Option<MountEntry> {
    let (mount, fs) = line.split_once(" - ")?;
    let mount: Vec<&str> = mount.split(' ').collect();
    let fs: Vec<&str> = fs.split(' ').collect();
    Some(MountEntry {
        device: mount.get(2)?.to_string(),
        point: PathBuf::from(unescape(mount.get(4)?)),
        mount_options: mount.get(5)?.to_string(),
        fstype: fs.first()?.to_string(),
        super_options: fs.get(2)?.to_string(),
    })
}

/// Undoes the kernel's octal escapes of space, tab, newline and backslash.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_line() {
        let line = "45 27 0:40 / /tmp/a\\040b ro,nosuid - fuse.verityfs /srv/b rw,user_id=0";
        let m = parse(line).unwrap();
        assert_eq!(m.device, "0:40");
        assert_eq!(m.point, Path::new("/tmp/a b"));
        assert_eq!(m.fstype, "fuse.verityfs");
        assert!(m.read_only());
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
    }
}
