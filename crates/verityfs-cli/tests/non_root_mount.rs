//! A mount by a normal user when `/dev/fuse` is not accessible to them
//! names the device and the remedy. The test makes the device inaccessible
//! whatever the machine's setting: in a private mount namespace (`unshare
//! -m`), a mode 0600 copy of the device node is bound over `/dev/fuse`,
//! then `verityfs mount` runs as `nobody`.

mod common;

use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;

#[test]
fn an_inaccessible_dev_fuse_is_named_with_the_remedy() {
    prerequisites();
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), Permissions::from_mode(0o755)).unwrap();
    let base = dir.path().canonicalize().unwrap();
    let (backing, mnt) = (base.join("backing"), base.join("mnt"));
    for d in [&backing, &mnt] {
        fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let script = format!(
        "set -e; mknod {dev} c 10 229; chmod 0600 {dev}; mount --bind {dev} /dev/fuse; \
         exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {VERITYFS} mount {b} {m}",
        dev = base.join("fuse").display(),
        b = backing.display(),
        m = mnt.display(),
    );
    let out = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(&script));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = format!(
        "ERROR: mounting '{}': Permission denied: /dev/fuse (mode 0600, owner 0:0) is not \
         readable and writable by this user: mounting without root needs it to be mode 0666",
        mnt.display()
    );
    assert!(stderr.starts_with(&want), "{stderr}");
    assert!(stderr.contains("or mount as root"), "{stderr}");
    assert!(!is_mounted(&mnt));
}
