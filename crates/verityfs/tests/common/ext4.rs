//! A test directory on ext4, for the tests of what only ext4 does (the
//! placement of a small verity file's blocks). Shared with the command line
//! tool's tests, which include this file by its path.
//!
//! The filesystem is a fresh one on a loop device of the test's own (the
//! tests run as root): what ext4 allows depends on how it was made and
//! mounted, and a host's own filesystem may refuse moving blocks.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh ext4 filesystem of 256 MiB in a sparse image, mounted for the
/// test and unmounted when dropped.
pub struct Ext4Dir {
    mnt: PathBuf,
    /// Holds the image and the mount point; removed after the unmount.
    _scratch: tempfile::TempDir,
}

impl Ext4Dir {
    /// The filesystem's root directory.
    pub fn path(&self) -> &Path {
        self.mnt.as_path()
    }
}

/// A fresh ext4 filesystem; the test fails, saying what failed, if it
/// cannot be made or mounted.
pub fn ext4_dir() -> Ext4Dir {
    let scratch = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let image = scratch.path().join("image");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let mnt = scratch.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // 4 KiB blocks, as on any filesystem of a real size (mke2fs gives
    // small ones 1 KiB blocks).
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .arg(&image));
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(&mnt));
    Ext4Dir {
        mnt,
        _scratch: scratch,
    }
}

impl Drop for Ext4Dir {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

#[track_caller]
fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (this test needs e2fsprogs and root)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed (this test needs root and loop devices): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
