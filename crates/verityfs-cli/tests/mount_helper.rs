//! `scripts/mount.fuse.verityfs`, the mount(8) helper, run as mount(8)
//! runs it (with the binary under test as `VERITYFS`): the daemon's
//! messages go to syslog by default and to `VERITYFS_LOG=FILE` on request,
//! and a failed mount prints the daemon's own error.

mod common;

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

fn helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mount.fuse.verityfs")
}

/// `mount.fuse.verityfs BACKING MNT -o OPTIONS` as mount(8) calls it, with
/// `env`.
fn mount_helper(backing: &Path, mnt: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(helper());
    cmd.arg(backing)
        .arg(mnt)
        .args(["-o", "allow_other", "-n"])
        .env("VERITYFS", VERITYFS)
        .env_remove("VERITYFS_LOG")
        .envs(env.iter().copied());
    run(&mut cmd)
}

/// A backing directory and a mount point, unmounted when dropped (the
/// daemon then exits by itself).
struct Dirs {
    _root: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    scratch: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        prerequisites();
        let root = tempfile::Builder::new()
            .prefix("verityfs-helper-test")
            .tempdir()
            .unwrap();
        let base = root.path().canonicalize().unwrap();
        let dirs = Dirs {
            backing: base.join("backing"),
            mnt: base.join("mnt"),
            scratch: base.join("scratch"),
            _root: root,
        };
        for dir in [&dirs.backing, &dirs.mnt, &dirs.scratch] {
            fs::create_dir(dir).unwrap();
        }
        dirs
    }

    /// The daemon serving the mount, found by its command line.
    fn daemon_pid(&self) -> u32 {
        let mnt = self.mnt.to_str().unwrap();
        let pids = fs::read_dir("/proc").unwrap().filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let ours = args.first() == Some(&VERITYFS.as_bytes())
                && args.get(1) == Some(&&b"mount"[..])
                && args.get(3) == Some(&mnt.as_bytes());
            ours.then_some(pid)
        });
        let pids: Vec<u32> = pids.collect();
        assert_eq!(pids.len(), 1, "daemons of {mnt}: {pids:?}");
        pids[0]
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg(&self.mnt).status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

#[test]
fn messages_go_to_syslog_by_default() {
    let d = Dirs::new();
    let out = mount_helper(&d.backing, &d.mnt, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(is_mounted(&d.mnt));
    let environ = fs::read(format!("/proc/{}/environ", d.daemon_pid())).unwrap();
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|v| v == b"VERITYFS_LOG=syslog"),
        "the daemon was not asked to log to syslog"
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    let warned = stderr.contains("no /dev/log");
    assert_eq!(warned, !Path::new("/dev/log").exists(), "{stderr}");
}

#[test]
fn corruption_reports_reach_the_syslog_socket() {
    let d = Dirs::new();
    let socket_path = d.scratch.join("log.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let target = format!("syslog:{}", socket_path.display());
    let out = mount_helper(&d.backing, &d.mnt, &[("VERITYFS_LOG", &target)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stderr).unwrap(), "");

    let data = random_bytes(50_000, 1);
    fs::write(d.mnt.join("f"), &data).unwrap();
    enable(&d.mnt.join("f"), &[]);
    flip_byte(&d.backing.join("f"), 100);
    let err = fs::read(d.mnt.join("f")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    let mut reports = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = socket.recv(&mut buf) {
            reports.push(String::from_utf8(buf[..n].to_vec()).unwrap());
        }
    }
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(
        reports[0].starts_with("<28>verityfs[") && reports[0].contains("FILE CORRUPTED! pos=0"),
        "{reports:?}"
    );
}

#[test]
fn a_failed_mount_prints_the_daemons_error() {
    let d = Dirs::new();
    // A file where the backing directory should be.
    let not_a_dir = d.scratch.join("file");
    fs::write(&not_a_dir, b"x").unwrap();
    for log in [None, Some(d.scratch.join("daemon.log"))] {
        if let Some(log) = &log {
            fs::write(log, "earlier messages\n").unwrap();
        }
        let log_setting = log.as_ref().map(|l| l.to_str().unwrap().to_owned());
        let env: Vec<(&str, &str)> = log_setting
            .iter()
            .map(|l| ("VERITYFS_LOG", l.as_str()))
            .collect();
        let out = mount_helper(&not_a_dir, &d.mnt, &env);
        assert_eq!(out.status.code(), Some(32));
        let stderr = String::from_utf8(out.stderr).unwrap();
        let error = format!(
            "\n  ERROR: backing directory '{}': Not a directory\n",
            not_a_dir.display()
        );
        assert!(stderr.contains("mount.fuse.verityfs: verityfs mount failed (status 1):\n"));
        assert!(stderr.ends_with(&error), "{stderr}");
        assert!(!stderr.contains("earlier messages"), "{stderr}");
        if let Some(log) = &log {
            assert!(fs::read_to_string(log).unwrap().contains("Not a directory"));
        }
    }
    assert!(!is_mounted(&d.mnt));
}
