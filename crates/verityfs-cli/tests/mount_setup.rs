//! How `verityfs mount` treats its operands, its mount options and how it
//! stops: layouts that would deadlock the daemon (a mount point its own
//! lookups reach), mount points others could redirect (a symbolic link,
//! another user's link on the path, a link swapped in while mounting, a
//! parent renamed or swapped for a link once mounted or while unmounting), a
//! BACKING that does not exist, a mount point that already is a verityfs
//! mount, messages of failures that are not the user's fault, the mount's
//! type and source, the usual mount options, and `mount -o remount,ro`.

mod common;

use std::fs::{self, Permissions};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// How long a `verityfs mount` that should refuse may take to do so.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh temporary directory (canonical path), readable by everyone.
fn temp_dir() -> (tempfile::TempDir, PathBuf) {
    prerequisites();
    let dir = tempfile::Builder::new()
        .prefix("verityfs-setup-test")
        .tempdir()
        .unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

/// Runs `verityfs mount ARGS` in `base`, which must exit with status 1 without
/// mounting `mnt`; returns its stderr. A daemon that mounts anyway is killed
/// and its mount removed before the test fails.
#[track_caller]
fn assert_mount_refused(base: &Path, args: &[&Path], extra: &[&str], mnt: &Path) -> String {
    let mnt = &mnt.canonicalize().unwrap_or(mnt.to_owned());
    let before = mounts_on(mnt);
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Spawned::new(
        Command::new(VERITYFS)
            .arg("mount")
            .args(args)
            .args(extra)
            .current_dir(base)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap()),
    );
    let status = wait_for(&mut child.0, REFUSE_TIMEOUT);
    let stderr = fs::read_to_string(log.path()).unwrap();
    if status.is_none() || mounts_on(mnt) != before {
        let _ = child.0.kill();
        let _ = child.0.wait();
        let _ = Command::new("umount").args(["-l", "-c"]).arg(mnt).status();
        panic!("verityfs mount {args:?} {extra:?} mounted instead of refusing:\n{stderr}");
    }
    assert_eq!(status.unwrap().code(), Some(1), "{stderr}");
    stderr
}

/// How many mounts there are on `mnt`.
fn mounts_on(mnt: &Path) -> usize {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == mnt.to_str())
        .count()
}

/// The `/proc/self/mountinfo` line of the mount on `mnt`.
fn mountinfo_line(mnt: &Path) -> String {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == mnt.to_str())
        .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()))
        .to_owned()
}

/// The filesystem type and source of the mount on `mnt`.
fn type_and_source(mnt: &Path) -> (String, String) {
    let line = mountinfo_line(mnt);
    let after = line.split(" - ").nth(1).unwrap().to_owned();
    let mut fields = after.split(' ');
    let fstype = fields.next().unwrap().to_owned();
    (fstype, fields.next().unwrap().to_owned())
}

/// A bind mount, removed when dropped.
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, to: &Path) -> Bind {
        fs::create_dir_all(to).unwrap();
        run_ok(Command::new("mount").arg("--bind").arg(from).arg(to));
        Bind(to.to_owned())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        // -c: no stat of the path, which could hang on a hung mount.
        let _ = Command::new("umount")
            .args(["-l", "-c"])
            .arg(&self.0)
            .status();
    }
}

// ---------------------------------------------------------------------------
// Layouts the daemon would deadlock on
// ---------------------------------------------------------------------------

#[test]
fn mount_point_inside_backing_is_refused() {
    let (_dir, base) = temp_dir();
    let backing = base.join("b");
    fs::create_dir_all(backing.join("sub/deeper")).unwrap();
    // The backing directory itself too: a stale mount there after a crash
    // would hide the backing directory from the next start.
    for mnt in [
        backing.clone(),
        backing.join("mnt"),
        backing.join("sub/deeper/mnt"),
    ] {
        fs::create_dir_all(&mnt).unwrap();
        let err = assert_mount_refused(&base, &[&backing, &mnt], &[], &mnt);
        assert!(err.contains("inside the backing directory"), "{err}");
    }
    // A mount point to be made there is not left behind.
    let mnt = backing.join("sub/new-mnt");
    let err = assert_mount_refused(&base, &[&backing, &mnt], &[], &mnt);
    assert!(err.contains("inside the backing directory"), "{err}");
    assert!(!mnt.exists(), "{} was left behind", mnt.display());
    // The same, named through a symbolic link and a relative path.
    symlink(&backing, base.join("link")).unwrap();
    let mnt = base.join("link/mnt");
    let err = assert_mount_refused(&base, &[&base.join("link/sub/.."), &mnt], &[], &mnt);
    assert!(err.contains("inside the backing directory"), "{err}");
    let err = assert_mount_refused(&base, &[Path::new("b"), Path::new("link/mnt")], &[], &mnt);
    assert!(err.contains("inside the backing directory"), "{err}");
}

#[test]
fn mount_point_reached_through_bind_mounts_is_refused() {
    let (_dir, base) = temp_dir();
    let (backing, elsewhere) = (base.join("b"), base.join("elsewhere"));
    fs::create_dir_all(&backing).unwrap();
    fs::create_dir_all(elsewhere.join("mnt")).unwrap();
    // The backing directory bind-mounted elsewhere: the mount point is in
    // it under another name.
    let alias = Bind::new(&backing, &base.join("alias"));
    fs::create_dir_all(backing.join("mnt")).unwrap();
    let mnt = alias.0.join("mnt");
    let err = assert_mount_refused(&base, &[&backing, &mnt], &[], &mnt);
    assert!(err.contains("inside the backing directory"), "{err}");
    // A directory holding the mount point bind-mounted inside the backing
    // directory: the daemon's lookups would reach the mount through it.
    let _inner = Bind::new(&elsewhere, &backing.join("inner"));
    let mnt = elsewhere.join("mnt");
    let err = assert_mount_refused(&base, &[&backing, &mnt], &[], &mnt);
    assert!(err.contains("inside the backing directory"), "{err}");
}

/// Resumes a stopped process when dropped.
struct Resume(rustix::process::Pid);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::CONT);
    }
}

#[test]
fn a_hung_mount_under_backing_does_not_hang_the_check() {
    let hung = Mount::new();
    let (_dir, base) = temp_dir();
    let (backing, mnt) = (base.join("b"), base.join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let _inner = Bind::new(&hung.mnt, &backing.join("inner"));
    // A daemon that answers nothing, once the kernel's cached attributes
    // of its root (one second) have expired.
    rustix::process::kill_process(hung.daemon_pid(), rustix::process::Signal::STOP).unwrap();
    let _resume = Resume(hung.daemon_pid());
    std::thread::sleep(Duration::from_millis(1500));
    let mut daemon = Spawned::new(
        Command::new(VERITYFS)
            .arg("mount")
            .arg(&backing)
            .arg(&mnt)
            .stdin(Stdio::null()),
    );
    let deadline = std::time::Instant::now() + MOUNT_TIMEOUT;
    while !is_mounted(&mnt) {
        let exited = daemon.0.try_wait().unwrap();
        assert!(exited.is_none(), "verityfs mount exited: {exited:?}");
        assert!(std::time::Instant::now() < deadline, "hung before mounting");
        std::thread::sleep(Duration::from_millis(10));
    }
    run_ok(Command::new("umount").arg(&mnt));
    assert!(wait_for(&mut daemon.0, EXIT_TIMEOUT).is_some_and(|s| s.success()));
}

// ---------------------------------------------------------------------------
// Mount points others could redirect
// ---------------------------------------------------------------------------

/// A uid no account has: the owner of links no one trusts.
const STRANGER: u32 = 12345;

/// A fresh temporary directory every user may enter, holding a backing
/// directory `b` that belongs to `nobody`.
fn open_base() -> (tempfile::TempDir, PathBuf) {
    let (dir, base) = temp_dir();
    fs::set_permissions(&base, Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(base.join("b")).unwrap();
    std::os::unix::fs::chown(base.join("b"), Some(NOBODY), Some(NOBODY)).unwrap();
    (dir, base)
}

/// Gives the symbolic link `link` (not what it points to) to `uid`.
fn give_link(link: &Path, uid: u32) {
    let uid = rustix::process::Uid::from_raw(uid);
    let flags = rustix::fs::AtFlags::SYMLINK_NOFOLLOW;
    rustix::fs::chownat(rustix::fs::CWD, link, Some(uid), None, flags).unwrap();
}

/// Where the mounts of the backing directory `source` are, as
/// `/proc/PID/mountinfo` (`self` or a process id) shows them.
fn mounts_of(pid: &str, source: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    let source = source.to_str().unwrap();
    info.lines()
        .filter(|l| l.split(" - ").nth(1).and_then(|fs| fs.split(' ').nth(1)) == Some(source))
        .map(|l| PathBuf::from(l.split(' ').nth(4).unwrap()))
        .collect()
}

/// Starts `cmd` with its standard error in a file, returned with it.
fn spawn_logged(cmd: &mut Command) -> (Spawned, tempfile::NamedTempFile) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let daemon = Spawned::new(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap()),
    );
    (daemon, log)
}

/// Starts `cmd` (a `verityfs mount`) and waits until `/proc/PID/mountinfo`
/// of the process shows its backing directory `source` mounted on `shown`.
fn mounted(cmd: &mut Command, source: &Path, shown: &Path) -> Spawned {
    let (mut daemon, log) = spawn_logged(cmd);
    let pid = daemon.pid().as_raw_nonzero().to_string();
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    while !mounts_of(&pid, source).iter().any(|p| p == shown) {
        if let Some(status) = daemon.0.try_wait().unwrap() {
            let stderr = fs::read_to_string(log.path()).unwrap();
            panic!(
                "exited ({status}) without mounting on {}: {stderr}",
                shown.display()
            );
        }
        assert!(Instant::now() < deadline, "no mount on {}", shown.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon
}

/// `verityfs mount BACKING MNT`.
fn verityfs_mount(backing: &Path, mnt: &Path) -> Command {
    let mut cmd = Command::new(VERITYFS);
    cmd.arg("mount").arg(backing).arg(mnt);
    cmd
}

/// Unmounts `shown` and checks that the daemon ends cleanly.
fn unmount(mut daemon: Spawned, shown: &Path) {
    run_ok(Command::new("umount").arg(shown));
    let status = wait_for(&mut daemon.0, EXIT_TIMEOUT).expect("daemon exit");
    assert!(status.success(), "{status}");
}

#[test]
fn a_symlink_as_mount_point_is_refused() {
    let (_dir, base) = open_base();
    let target = base.join("target");
    fs::create_dir(&target).unwrap();
    // Even root's own: the mount would not be where it was asked for.
    symlink(&target, base.join("link")).unwrap();
    for mnt in ["link", "link/"] {
        let args = [Path::new("b"), Path::new(mnt)];
        let err = assert_mount_refused(&base, &args, &[], &target);
        let want = format!("mount point '{mnt}' is a symbolic link, not followed");
        assert!(err.contains(&want), "{err}");
    }
    assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
}

#[test]
fn a_path_through_another_user_s_symlink_is_refused() {
    let (_dir, base) = open_base();
    let (victim, attacker) = (base.join("victim"), base.join("attacker"));
    fs::create_dir(&victim).unwrap();
    fs::create_dir(&attacker).unwrap();
    std::os::unix::fs::chown(&attacker, Some(NOBODY), Some(NOBODY)).unwrap();
    // In a directory of its own, nobody links to a directory of root's.
    let link = attacker.join("link");
    run_ok(as_nobody("ln").arg("-s").arg(&victim).arg(&link));
    for (mnt, victim_mnt) in [
        (link.join("mnt"), victim.join("mnt")),
        (link.join("new/mnt"), victim.join("new/mnt")),
    ] {
        let err = assert_mount_refused(&base, &[&base.join("b"), &mnt], &[], &victim_mnt);
        let want = format!(
            "'{}' is a symbolic link of uid {NOBODY}, not followed (only links of root's are)",
            link.display()
        );
        assert!(err.contains(&want), "{err}");
    }
    assert_eq!(mounts_on(&victim), 0);
    assert_eq!(
        fs::read_dir(&victim).unwrap().count(),
        0,
        "something was made in the victim's directory"
    );
}

#[test]
fn a_backing_directory_behind_another_user_s_link_is_refused() {
    let (_dir, base) = open_base();
    let (secret, home, mnt) = (base.join("secret"), base.join("home"), base.join("mnt"));
    fs::create_dir(&secret).unwrap();
    fs::write(secret.join("key"), b"root's").unwrap();
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    // nobody's share, which root's daemon is asked to serve, becomes a link
    // to a directory of root's; or a link on the way leads there.
    let (share, way) = (home.join("share"), home.join("way"));
    run_ok(as_nobody("ln").arg("-s").arg(&secret).arg(&share));
    run_ok(as_nobody("ln").arg("-s").arg(&base).arg(&way));
    let refused = format!("is a symbolic link of uid {NOBODY}, not followed");
    for (backing, link) in [
        (share.clone(), String::new()),
        (way.join("secret"), format!(": '{}'", way.display())),
    ] {
        let err = assert_mount_refused(&base, &[&backing, &mnt], &[], &mnt);
        let want = format!("backing directory '{}'{link} {refused}", backing.display());
        assert!(err.contains(&want), "{err}");
    }
    assert_eq!(mounts_on(&mnt), 0);
}

#[test]
fn a_backing_directory_behind_root_s_link_is_served() {
    let (_dir, base) = open_base();
    let (backing, link, mnt) = (base.join("b"), base.join("served"), base.join("mnt"));
    symlink("b", &link).unwrap();
    let daemon = mounted(&mut verityfs_mount(&link, &mnt), &backing, &mnt);
    fs::write(mnt.join("f"), b"x").unwrap();
    assert_eq!(fs::read(backing.join("f")).unwrap(), b"x");
    unmount(daemon, &mnt);
}

#[test]
fn root_s_links_on_the_path_are_followed_and_missing_directories_made() {
    let (_dir, base) = open_base();
    // As /var/run -> /run.
    fs::create_dir(base.join("run")).unwrap();
    symlink("run", base.join("var-run")).unwrap();
    let backing = base.join("b");
    let shown = base.join("run/new/a/mnt");
    let mnt = base.join("var-run/new/a/mnt");
    let daemon = mounted(&mut verityfs_mount(&backing, &mnt), &backing, &shown);
    fs::write(shown.join("f"), b"x").unwrap();
    assert_eq!(fs::read(backing.join("f")).unwrap(), b"x");
    unmount(daemon, &shown);
    for made in ["run/new", "run/new/a", "run/new/a/mnt"] {
        let m = fs::symlink_metadata(base.join(made)).unwrap();
        assert!(m.is_dir() && m.uid() == 0, "{made}: {m:?}");
    }
}

#[test]
fn an_unprivileged_daemon_follows_its_own_links_and_root_s_only() {
    let (_dir, base) = open_base();
    let (backing, home) = (base.join("b"), base.join("home"));
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    run_ok(as_nobody("mkdir").arg(home.join("real")));
    run_ok(as_nobody("ln").arg("-s").arg("real").arg(home.join("mine")));
    symlink(home.join("real"), base.join("foreign")).unwrap();
    give_link(&base.join("foreign"), STRANGER);
    symlink(&home, base.join("roots")).unwrap();

    let shown = home.join("real/new/mnt");
    let mnt = base.join("roots/mine/new/mnt");
    let daemon = mounted(
        &mut nobody_mount(&base, &[&backing, &mnt], &[]),
        &backing,
        &shown,
    );
    // Its mount namespace ends with it.
    drop(daemon);
    let m = fs::metadata(&shown).unwrap();
    assert_eq!(m.uid(), NOBODY, "made by nobody");

    let out = run(as_nobody(VERITYFS)
        .arg("mount")
        .arg(&backing)
        .arg(base.join("foreign/other")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = format!("is a symbolic link of uid {STRANGER}, not followed (only links of root's or uid {NOBODY}'s are)");
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!home.join("real/other").exists());
}

/// Sets up the mount namespace of [`nobody_mount`] (the node BASE/fuse is
/// `$1`), then runs the rest of its arguments as uid and gid `$2`.
const AS_NOBODY_WITH_FUSE: &str = r#"
set -e
dev=$1; id=$2; shift 2
mknod "$dev" c 10 229; chmod 0666 "$dev"; mount --bind "$dev" /dev/fuse
echo user_allow_other > "$dev.conf"; mount --bind "$dev.conf" /etc/fuse.conf
exec setpriv --reuid="$id" --regid="$id" --clear-groups "$@"
"#;

/// `verityfs mount ARGS EXTRA` run by `nobody`, so mounted by
/// fusermount3: in a mount namespace of its own (which ends with the
/// daemon), where /dev/fuse is a node nobody may open (whatever this
/// machine's mode) and fuse.conf lets users give `allow_root`.
fn nobody_mount(base: &Path, args: &[&Path], extra: &[&str]) -> Command {
    let mut unshared = Command::new("unshare");
    unshared
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .args([AS_NOBODY_WITH_FUSE, "sh"])
        .arg(base.join("fuse"))
        .arg(NOBODY.to_string())
        .args([VERITYFS, "mount"])
        .args(args)
        .args(extra);
    unshared
}

/// Swaps DIR/mnt for a symbolic link to VICTIM and back, as fast as it
/// can, until killed.
const SWAPPER: &str = "\
import os, sys
d, victim = sys.argv[1], sys.argv[2]
mnt, aside = os.path.join(d, 'mnt'), os.path.join(d, 'aside')
steps = [lambda: os.rename(mnt, aside), lambda: os.symlink(victim, mnt),
         lambda: os.unlink(mnt), lambda: os.rename(aside, mnt)]
while True:
    for step in steps:
        try:
            step()
        except OSError:
            pass
";

/// How many mounts race with the swapper.
const RACING_MOUNTS: usize = 30;

#[test]
fn a_mount_point_swapped_for_a_link_meanwhile_is_never_followed() {
    let (_dir, base) = open_base();
    let (victim, attacker) = (base.join("victim"), base.join("attacker"));
    let backing = base.join("b");
    fs::create_dir(&victim).unwrap();
    fs::create_dir(&attacker).unwrap();
    std::os::unix::fs::chown(&attacker, Some(NOBODY), Some(NOBODY)).unwrap();
    run_ok(as_nobody("mkdir").arg(attacker.join("mnt")));
    // The system's python3: nobody may not run another.
    let mut swapper = Spawned::new(
        as_nobody("/usr/bin/python3")
            .args(["-c", SWAPPER])
            .arg(&attacker)
            .arg(&victim),
    );
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    while !fs::symlink_metadata(attacker.join("mnt")).is_ok_and(|m| m.is_symlink()) {
        let exited = swapper.0.try_wait().unwrap();
        assert!(exited.is_none(), "the swapper exited: {exited:?}");
        assert!(Instant::now() < deadline, "the swapper does not swap");
    }
    let (mut mounted, mut refused) = (0, 0);
    for _ in 0..RACING_MOUNTS {
        let mut daemon = Spawned::new(
            verityfs_mount(&backing, &attacker.join("mnt"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        let points = loop {
            let points = mounts_of("self", &backing);
            if !points.is_empty() {
                break points;
            }
            if daemon.0.try_wait().unwrap().is_some() {
                break points;
            }
            assert!(Instant::now() < deadline, "neither mounted nor refused");
            std::thread::sleep(Duration::from_millis(1));
        };
        if points.is_empty() {
            refused += 1;
            continue;
        }
        mounted += 1;
        // Taken down wherever it is (the swapper may have moved it since),
        // before anything is asserted.
        let stopped = stop(swapper.pid());
        let points = mounts_of("self", &backing);
        for point in &points {
            let flags = rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW;
            let unmounted = rustix::mount::unmount(point, flags);
            assert!(unmounted.is_ok(), "{}: {unmounted:?}", point.display());
        }
        drop((stopped, daemon));
        for point in points {
            assert!(
                point.starts_with(&attacker),
                "mounted outside the attacker's directory: {}",
                point.display()
            );
        }
    }
    assert_eq!(fs::read_dir(&victim).unwrap().count(), 0);
    eprintln!("{mounted} mounted in the attacker's directory, {refused} refused");
}

/// A tmpfs of root's, unmounted when dropped: the mount a redirected
/// unmount would take down.
struct Victim(PathBuf);

impl Victim {
    /// A tmpfs on the new directory `dir`, holding a file `kept`.
    fn mount(dir: &Path) -> Victim {
        fs::create_dir(dir).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "victim"])
                .arg(dir),
        );
        fs::write(dir.join("kept"), b"").unwrap();
        Victim(dir.to_owned())
    }

    /// Whether it is still mounted.
    fn mounted(&self) -> bool {
        self.0.join("kept").exists()
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// A directory of nobody's, `attacker`, holding `sub/mnt` (directories of
/// nobody's) and `lnk`, nobody's symbolic link to `victim`, a directory
/// of root's holding a mount of root's, `mnt`.
fn attacker_and_victim(base: &Path) -> (PathBuf, Victim) {
    let (attacker, victim) = (base.join("attacker"), base.join("victim"));
    fs::create_dir(&attacker).unwrap();
    std::os::unix::fs::chown(&attacker, Some(NOBODY), Some(NOBODY)).unwrap();
    fs::create_dir(&victim).unwrap();
    let victim = Victim::mount(&victim.join("mnt"));
    run_ok(as_nobody("mkdir").arg("-p").arg(attacker.join("sub/mnt")));
    run_ok(
        as_nobody("ln")
            .arg("-s")
            .arg(base.join("victim"))
            .arg(attacker.join("lnk")),
    );
    (attacker, victim)
}

/// Sends `signal` to the daemon.
fn signal(daemon: &Spawned, signal: rustix::process::Signal) {
    rustix::process::kill_process(daemon.pid(), signal).unwrap();
}

/// Takes the mounts of `backing` down wherever they are.
fn detach_all(backing: &Path) {
    for point in mounts_of("self", backing) {
        let flags = rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW;
        let unmounted = rustix::mount::unmount(&point, flags);
        assert!(unmounted.is_ok(), "{}: {unmounted:?}", point.display());
    }
}

#[test]
fn a_mount_point_whose_parent_was_renamed_or_replaced_by_a_link_is_still_found() {
    let (_dir, base) = open_base();
    let backing = base.join("b");
    let (attacker, victim) = attacker_and_victim(&base);
    let mut daemon = mounted(
        &mut verityfs_mount(&backing, &attacker.join("sub/mnt")),
        &backing,
        &attacker.join("sub/mnt"),
    );
    let f = backing.join("f");
    fs::write(&f, b"stays ordinary").unwrap();
    // Once mounted, nobody renames the mount point's parent and puts a
    // link to the victim's directory in its place: the name the mount
    // was made on now leads to the victim's mount.
    let moved = attacker.join("moved");
    run_ok(as_nobody("mv").arg(attacker.join("sub")).arg(&moved));
    run_ok(
        as_nobody("mv")
            .arg(attacker.join("lnk"))
            .arg(attacker.join("sub")),
    );
    assert!(is_mounted(&moved.join("mnt")));
    // The daemon still sees its own mount's flags where it is now...
    run_ok(
        Command::new("mount")
            .args(["-i", "-o", "remount,ro"])
            .arg(moved.join("mnt")),
    );
    let enabled = raw_enable(&moved.join("mnt/f"), &EnableArg::default());
    // ...and a signal unmounts that one, not the victim's (checked once
    // the mount is taken down, whatever the daemon did).
    signal(&daemon, rustix::process::Signal::TERM);
    let status = wait_for(&mut daemon.0, EXIT_TIMEOUT);
    let left = mounts_of("self", &backing);
    detach_all(&backing);
    assert!(victim.mounted(), "the victim's mount was unmounted");
    assert_errno(enabled, libc::EROFS, "enable after remount,ro");
    assert!(left.is_empty(), "still mounted on {left:?}");
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// Exchanges DIR/sub and DIR/lnk (renameat2 with `RENAME_EXCHANGE`) as
/// fast as it can, until killed.
const EXCHANGER: &str = "\
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d = os.fsencode(sys.argv[1])
sub, lnk = os.path.join(d, b'sub'), os.path.join(d, b'lnk')
while True:
    libc.renameat2(-100, sub, -100, lnk, 2)
";

/// How many daemons are signalled while the exchanger runs.
const SIGNALLED_DAEMONS: usize = 30;

#[test]
fn a_parent_swapped_for_a_link_while_unmounting_neither_redirects_nor_stops_the_unmount() {
    let (_dir, base) = open_base();
    let backing = base.join("b");
    let (attacker, victim) = attacker_and_victim(&base);
    let (sub, lnk) = (attacker.join("sub"), attacker.join("lnk"));
    let mut exited = 0;
    for round in 0..SIGNALLED_DAEMONS {
        let mnt = sub.join("mnt");
        let mut daemon = mounted(&mut verityfs_mount(&backing, &mnt), &backing, &mnt);
        let exchanger = Spawned::new(
            as_nobody("/usr/bin/python3")
                .args(["-c", EXCHANGER])
                .arg(&attacker),
        );
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        while !fs::symlink_metadata(&lnk).is_ok_and(|m| m.is_dir()) {
            assert!(Instant::now() < deadline, "the exchanger does not exchange");
        }
        signal(&daemon, rustix::process::Signal::TERM);
        let status = wait_for(&mut daemon.0, EXIT_TIMEOUT);
        drop(exchanger);
        if fs::symlink_metadata(&sub).unwrap().is_symlink() {
            let exchange = rustix::fs::RenameFlags::EXCHANGE;
            let cwd = rustix::fs::CWD;
            rustix::fs::renameat_with(cwd, &sub, cwd, &lnk, exchange).unwrap();
        }
        detach_all(&backing);
        drop(daemon);
        assert!(
            victim.mounted(),
            "round {round}: the victim's mount was unmounted"
        );
        exited += usize::from(status.is_some_and(|s| s.success()));
    }
    // The place is checked by its mount ID, which renames above it do not
    // change: no daemon took its own mount for gone.
    assert_eq!(
        exited, SIGNALLED_DAEMONS,
        "daemons that unmounted their mount and exited 0"
    );
}

/// Stops `pid` (SIGSTOP) until the guard returned is dropped.
fn stop(pid: rustix::process::Pid) -> Resume {
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    Resume(pid)
}

// ---------------------------------------------------------------------------
// Operands that do not exist, and mounts already there
// ---------------------------------------------------------------------------

#[test]
fn missing_backing_is_refused_unless_create() {
    let (_dir, base) = temp_dir();
    let (backing, mnt) = (base.join("typo"), base.join("mnt"));
    fs::create_dir(&mnt).unwrap();
    for extra in [&[][..], &["--read-only"], &["-o", "ro"]] {
        let err = assert_mount_refused(&base, &[&backing, &mnt], extra, &mnt);
        assert!(
            err.contains("typo") && err.contains("No such file or directory"),
            "{extra:?}: {err}"
        );
        assert!(err.contains("--create"), "{err}");
        assert!(!backing.exists(), "{extra:?} created the backing directory");
    }
    // Not a directory either.
    fs::write(&backing, b"").unwrap();
    let err = assert_mount_refused(&base, &[&backing, &mnt], &[], &mnt);
    assert!(err.contains("Not a directory"), "{err}");
    fs::remove_file(&backing).unwrap();

    // --create makes it (and its parents), and mounts it.
    let backing = base.join("new/backing");
    let mut daemon = Spawned::new(
        Command::new(VERITYFS)
            .arg("mount")
            .arg(&backing)
            .arg(&mnt)
            .arg("--create")
            .stdin(Stdio::null()),
    );
    let deadline = std::time::Instant::now() + MOUNT_TIMEOUT;
    while !is_mounted(&mnt) {
        assert!(daemon.0.try_wait().unwrap().is_none(), "--create failed");
        assert!(std::time::Instant::now() < deadline, "--create: no mount");
        std::thread::sleep(Duration::from_millis(10));
    }
    fs::write(mnt.join("f"), b"x").unwrap();
    assert_eq!(fs::read(backing.join("f")).unwrap(), b"x");
    run_ok(Command::new("umount").arg(&mnt));
    let status = wait_for(&mut daemon.0, EXIT_TIMEOUT).expect("daemon exit");
    assert!(status.success());
}

#[test]
fn mounting_over_a_verityfs_mount_is_refused() {
    let m = Mount::new();
    fs::write(m.path("f"), b"first").unwrap();
    let other = m.scratch("other");
    fs::create_dir(&other).unwrap();
    let err = assert_mount_refused(&m.scratch, &[&other, &m.mnt], &[], &m.mnt);
    assert!(err.contains("already a verityfs mount"), "{err}");
    // The first mount still serves.
    assert_eq!(fs::read(m.path("f")).unwrap(), b"first");
    assert_eq!(mounts_on(&m.mnt), 1);
}

#[test]
fn backing_probe_failure_names_the_backing_directory() {
    let (_dir, base) = temp_dir();
    let mnt = base.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let err = assert_mount_refused(&base, &[Path::new("/proc/self"), &mnt], &[], &mnt);
    assert!(err.contains("'/proc/self'"), "{err}");
    assert!(!err.contains(mnt.to_str().unwrap()), "{err}");
}

// ---------------------------------------------------------------------------
// Stopping
// ---------------------------------------------------------------------------

#[test]
fn external_umount_is_a_clean_stop_even_in_verbose_logs() {
    let (_dir, base) = temp_dir();
    let (backing, mnt, log) = (base.join("b"), base.join("m"), base.join("log"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let mut daemon = Spawned::new(
        Command::new(VERITYFS)
            .arg("mount")
            .arg(&backing)
            .arg(&mnt)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::create(&log).unwrap()),
    );
    let deadline = std::time::Instant::now() + MOUNT_TIMEOUT;
    while !is_mounted(&mnt) {
        assert!(std::time::Instant::now() < deadline, "no mount");
        std::thread::sleep(Duration::from_millis(10));
    }
    fs::write(mnt.join("f"), b"x").unwrap();
    run_ok(Command::new("umount").arg(&mnt));
    let status = wait_for(&mut daemon.0, EXIT_TIMEOUT).expect("daemon exit");
    let log = fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{status}: {log}");
    for level in ["WARN", "ERROR"] {
        assert!(!log.contains(level), "{log}");
    }
}

// ---------------------------------------------------------------------------
// Mount options and the mount's own flags
// ---------------------------------------------------------------------------

#[test]
fn shows_as_fuse_verityfs_with_an_absolute_source() {
    let m = Mount::new();
    let (fstype, source) = type_and_source(&m.mnt);
    assert_eq!(fstype, "fuse.verityfs");
    assert_eq!(Path::new(&source), m.backing);
    drop(m);
    // A relative BACKING is shown absolute.
    let (_dir, base) = {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        (dir, base)
    };
    fs::create_dir(base.join("b")).unwrap();
    fs::create_dir(base.join("m")).unwrap();
    let _daemon = Spawned::new(
        Command::new(VERITYFS)
            .args(["mount", "b", "m"])
            .current_dir(&base)
            .stdin(std::process::Stdio::null()),
    );
    let deadline = std::time::Instant::now() + MOUNT_TIMEOUT;
    while !is_mounted(&base.join("m")) {
        assert!(std::time::Instant::now() < deadline, "no mount");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (fstype, source) = type_and_source(&base.join("m"));
    run_ok(Command::new("umount").arg(base.join("m")));
    assert_eq!(
        (fstype.as_str(), Path::new(&source)),
        ("fuse.verityfs", &*base.join("b"))
    );
}

#[test]
fn common_mount_options_are_accepted() {
    for options in [
        "nodiratime",
        "strictatime",
        "relatime",
        "noatime",
        "lazytime",
        "diratime",
        "default_permissions",
        "allow_root",
        "dirsync",
        "sync",
        "async",
        "noexec",
        "nodev,nosuid",
        "rw",
        "defaults",
        "x-systemd.automount",
        "fsname=mine",
        "subtype=mine",
    ] {
        let m = Mount::with_args(&["-o", options]);
        fs::write(m.path("f"), b"x").unwrap();
        let line = mountinfo_line(&m.mnt);
        let (fstype, source) = type_and_source(&m.mnt);
        match options {
            "fsname=mine" => assert_eq!(source, "mine"),
            "subtype=mine" => assert_eq!(fstype, "fuse.mine"),
            _ => assert_eq!(
                (fstype.as_str(), Path::new(&source)),
                ("fuse.verityfs", &*m.backing)
            ),
        }
        let per_mount = line.split(' ').nth(5).unwrap();
        for flag in ["noexec", "noatime", "sync", "dirsync"] {
            if options == flag {
                assert!(line.contains(flag), "{options}: {line}");
            }
        }
        assert!(
            per_mount.contains("nosuid") && per_mount.contains("nodev"),
            "{line}"
        );
    }
}

#[test]
fn enable_after_remount_read_only_is_erofs() {
    let mut m = Mount::new();
    let f = write_file(&m, "f", b"stays ordinary");
    run_ok(
        Command::new("mount")
            .args(["-i", "-o", "remount,ro"])
            .arg(&m.mnt),
    );
    assert!(mountinfo_line(&m.mnt)
        .split(' ')
        .nth(5)
        .unwrap()
        .starts_with("ro"));
    assert_errno(raw_enable(&f, &EnableArg::default()), libc::EROFS, "enable");
    assert_eq!(fs::read(m.backing("f")).unwrap(), b"stays ordinary");
    assert_eq!(xattr_names(&m.backing("f")).unwrap(), Vec::<String>::new());
    // Through the mount(8) helper, as `mount -o remount,rw` runs it.
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mount.fuse.verityfs");
    run_ok(
        Command::new(helper)
            .arg(&m.backing)
            .arg(&m.mnt)
            .args(["-o", "remount,rw"]),
    );
    assert!(mountinfo_line(&m.mnt)
        .split(' ')
        .nth(5)
        .unwrap()
        .starts_with("rw"));
    enable(&f, &[]);
    m.unmount();
}

/// In BASE ($1), with mounts of another user's making on names that are
/// not UTF-8 and hold a newline: `verityfs` ($2) mounts on a directory
/// under one of them (of a name with a space), `dump_metadata` finds a
/// file's backing file through it, `remount,ro` still stops enabling,
/// and SIGTERM unmounts it with exit status 0.
const ODD_NAMES: &str = r#"
set -eu
cd "$1"
ff=$(printf 'x\377'); nl=$(printf 'a b\nc'); mnt="$ff/m n"
mkdir "$ff" "$nl" b
mount -t tmpfs odd "$ff"
mount -t tmpfs odd "$nl"
mkdir "$mnt"
echo data > b/f
"$2" mount b "$mnt" 2> log & daemon=$!
# Whatever fails: the daemon holds the test's output open.
trap 'kill -KILL "$daemon" 2> /dev/null || true' EXIT
tries=0
until mountpoint -q "$mnt"; do
    kill -0 "$daemon" 2> /dev/null || { echo "not mounted: $(cat log)"; exit 1; }
    tries=$((tries + 1)); [ "$tries" -lt 500 ] || { echo "mount timed out"; exit 1; }
    sleep 0.02
done
echo data > b/g
fsverity enable "$mnt/g"
"$2" dump_metadata descriptor "$mnt/g" > descriptor || { echo "dump_metadata failed"; exit 1; }
mount -i -o remount,ro "$mnt"
if fsverity enable "$mnt/f" 2> err; then echo "enabled on a read-only mount"; exit 1; fi
grep -q "Read-only file system" err || { echo "enable: $(cat err)"; exit 1; }
kill -TERM "$daemon"
status=0; wait "$daemon" || status=$?
[ "$status" -eq 0 ] || { echo "exit status $status after SIGTERM: $(cat log)"; exit 1; }
if mountpoint -q "$mnt"; then echo "still mounted after SIGTERM"; exit 1; fi
echo done
"#;

#[test]
fn mount_points_of_any_bytes_in_the_mount_table_break_nothing() {
    let (_dir, base) = temp_dir();
    // The mounts stay in a mount namespace of the test's own.
    let out = run(Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            ODD_NAMES,
            "sh",
        ])
        .arg(&base)
        .arg(VERITYFS));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(stdout.trim(), "done", "{stderr}");
}

/// A directory of `nobody`'s in `base`, with `names` made in it by
/// `nobody`.
fn nobody_home(base: &Path, names: &[&str]) -> PathBuf {
    let home = base.join("home");
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    for name in names {
        run_ok(as_nobody("mkdir").arg(home.join(name)));
    }
    home
}

/// The `/proc/PID/mountinfo` line of the mount on `mnt` in the mount
/// namespace of `daemon`.
fn mountinfo_line_of(daemon: &Spawned, mnt: &Path) -> String {
    let pid = daemon.pid().as_raw_nonzero();
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == mnt.to_str())
        .unwrap_or_else(|| panic!("{} is not mounted", mnt.display()))
        .to_owned()
}

#[test]
fn auto_unmount_is_refused_to_root_only() {
    let (_dir, base) = open_base();
    let home = nobody_home(&base, &["mnt"]);
    let mnt = home.join("mnt");
    let err = assert_mount_refused(
        &base,
        &[Path::new("b"), &mnt],
        &["-o", "auto_unmount"],
        &mnt,
    );
    let want = "auto_unmount is refused to root: fusermount3 would look the mount point up \
                again as root, following symbolic links others may have put on the path";
    assert!(err.contains(want), "{err}");
    // A user's fusermount3 looks the path up with that user's rights.
    let backing = base.join("b");
    let daemon = mounted(
        &mut nobody_mount(&base, &[&backing, &mnt], &["-o", "auto_unmount"]),
        &backing,
        &mnt,
    );
    drop(daemon);
}

#[test]
fn a_user_s_daemon_unmounts_its_mount_on_sigterm() {
    let (_dir, base) = open_base();
    let home = nobody_home(&base, &["b", "mnt"]);
    let (backing, mnt) = (home.join("b"), home.join("mnt"));
    let mut daemon = mounted(
        &mut nobody_mount(&base, &[&backing, &mnt], &[]),
        &backing,
        &mnt,
    );
    rustix::process::kill_process(daemon.pid(), rustix::process::Signal::TERM).unwrap();
    let status = wait_for(&mut daemon.0, EXIT_TIMEOUT).expect("no exit on SIGTERM");
    assert!(status.success(), "{status}");
}

#[test]
fn a_refused_unmount_is_tried_again_at_the_next_signal() {
    let (_dir, base) = open_base();
    let (backing, mnt, other) = (base.join("b"), base.join("mnt"), base.join("other"));
    fs::create_dir(&other).unwrap();
    let mut daemon = mounted(&mut verityfs_mount(&backing, &mnt), &backing, &mnt);
    // Someone mounts over ours: the place no longer holds our mount, and
    // the daemon must not unmount what is there now.
    run_ok(Command::new("mount").arg("--bind").arg(&other).arg(&mnt));
    signal(&daemon, rustix::process::Signal::TERM);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        daemon.0.try_wait().unwrap().is_none(),
        "exited, its mount hidden"
    );
    run_ok(Command::new("umount").arg(&mnt));
    // Once that one is gone, the next signal unmounts ours.
    signal(&daemon, rustix::process::Signal::TERM);
    let status = wait_for(&mut daemon.0, EXIT_TIMEOUT);
    let left = mounts_of("self", &backing);
    detach_all(&backing);
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(left.is_empty(), "still mounted on {left:?}");
}

#[test]
fn a_comma_in_the_backing_path_adds_no_mount_option() {
    let injected = "b,allow_other,max_read=4096";
    let (_dir, base) = open_base();
    let home = nobody_home(&base, &[injected, "mnt"]);
    let (backing, mnt) = (home.join(injected), home.join("mnt"));
    let mut cmd = nobody_mount(&base, &[&backing, &mnt], &[]);
    let (mut daemon, log) = spawn_logged(&mut cmd);
    let pid = daemon.pid().as_raw_nonzero().to_string();
    let deadline = Instant::now() + MOUNT_TIMEOUT;
    while !mounts_of(&pid, &backing).contains(&mnt) {
        let stderr = fs::read_to_string(log.path()).unwrap();
        let info = fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
        let line = info.lines().find(|l| l.split(' ').nth(4) == mnt.to_str());
        if let Some(line) = line {
            panic!("mounted with another source or options: {line}");
        }
        if let Some(status) = daemon.0.try_wait().unwrap() {
            panic!("exited ({status}) without mounting: {stderr}");
        }
        assert!(Instant::now() < deadline, "no mount on {}", mnt.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    let line = mountinfo_line_of(&daemon, &mnt);
    let super_options = line.split(' ').next_back().unwrap();
    for option in super_options.split(',') {
        assert!(
            option != "allow_other" && !option.starts_with("max_read="),
            "{line}"
        );
    }
}

/// In BASE ($1), as root in a mount namespace of its own: `nobody` ($3)
/// mounts `verityfs` ($2) with `allow_other` over a directory of root's
/// (that anyone may write, so that nobody's daemon can) holding root's
/// link to BASE/victim; root's `verityfs mount` through
/// that link must be refused, as the FUSE daemon of `nobody` says who
/// owns the link.
const LINK_ON_A_USER_S_FUSE: &str = r#"
set -eu
base=$1 verityfs=$2 id=$3
cd "$base"
mknod fuse c 10 229; chmod 0666 fuse; mount --bind fuse /dev/fuse
echo user_allow_other > fuse.conf; mount --bind fuse.conf /etc/fuse.conf
mkdir rb victim m; chmod 1777 rb; ln -s "$base/victim" rb/link; chown "$id" m
setpriv --reuid="$id" --regid="$id" --clear-groups "$verityfs" mount -o allow_other rb m & daemon=$!
trap 'kill -KILL "$daemon" 2> /dev/null || true' EXIT
tries=0
until mountpoint -q m; do
    tries=$((tries + 1)); [ "$tries" -lt 500 ] || { echo "no mount by $id"; exit 1; }
    sleep 0.02
done
status=0; timeout 10 "$verityfs" mount b m/link/x 2>&1 || status=$?
[ "$status" -eq 1 ] || echo "exit status $status"
[ ! -e victim/x ] || echo "made in the victim's directory"
"#;

#[test]
fn a_link_on_another_user_s_fuse_mount_is_not_followed() {
    let (_dir, base) = open_base();
    let out = run(Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .args([LINK_ON_A_USER_S_FUSE, "sh"])
        .arg(&base)
        .arg(VERITYFS)
        .arg(NOBODY.to_string()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let want = format!(
        "'m/link' is a symbolic link on a FUSE mount of uid {NOBODY}, not followed \
         (only links on mounts of root's are)"
    );
    assert!(stdout.contains(&want), "{stdout}{stderr}");
    assert!(
        !stdout.contains("exit status") && !stdout.contains("victim"),
        "{stdout}"
    );
}
