//! A test directory on ext4, for the tests of what only ext4 does (the
//! placement of a small verity file's blocks). Shared with the command line
//! tool's tests, which include this file by its path.

/// A fresh directory in the target directory's temporary directory, which
/// must be on ext4: the test fails, saying so, if it is not.
pub fn ext4_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let fs = rustix::fs::statfs(dir.path()).unwrap();
    assert!(
        fs.f_type == libc::EXT4_SUPER_MAGIC as _,
        "{} is not on ext4 (filesystem type {:#x}): this test needs ext4",
        dir.path().display(),
        fs.f_type
    );
    dir
}
