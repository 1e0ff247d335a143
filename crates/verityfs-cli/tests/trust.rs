//! What an attacker may try against a mount, on real mounts:
//!
//! - someone who can write the backing directory turns a file into a
//!   verity file behind the daemon's back (copying a genuine verity file
//!   over it, extended attributes included) and then tampers with its
//!   data: no reader, whatever descriptor it holds, may get a byte that
//!   does not verify;
//! - an unprivileged user of an `allow_other` mount races renames in a
//!   backing directory they can write against creations through the mount:
//!   the root daemon must never hand them a root-owned object or write into
//!   one;
//! - writes through the mount are subject to the backing filesystem's
//!   reserved blocks, as direct writes are.
//!
//! The racers run as `nobody`. Race durations: `VERITYFS_RACE_SECS`
//! (default 10 seconds per race).

mod common;

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::fs::{fadvise, Advice};

use common::*;

/// The file's size: several blocks, so that the tampered one is not the
/// first.
const SIZE: usize = 300_000;
/// Where the attacker changes the stored data.
const TAMPERED: u64 = 135_000;

/// A plain file `victim` and a verity file `genuine` with the same contents,
/// both made through the mount.
fn victim_and_genuine(m: &Mount) -> Vec<u8> {
    let data = random_bytes(SIZE, 7);
    fs::write(m.path("victim"), &data).unwrap();
    fs::write(m.path("genuine"), &data).unwrap();
    enable(&m.path("genuine"), &[]);
    data
}

/// [`victim_and_genuine`]; the data, the genuine file's digest, and the
/// data with the byte at [`TAMPERED`] changed (the attacker's copy).
fn genuine_and_tampered(m: &Mount) -> (Vec<u8>, String, Vec<u8>) {
    let data = victim_and_genuine(m);
    let mut tampered = data.clone();
    tampered[TAMPERED as usize] ^= 0xff;
    (data, measure(&m.path("genuine")), tampered)
}

/// Copies the genuine verity file over the victim's backing file in place
/// (the same inode), extended attributes included, as `cp` does.
fn copy_genuine_over_victim(m: &Mount) {
    let victim = m.backing("victim");
    let ino = fs::metadata(&victim).unwrap().ino();
    run_ok(
        Command::new("cp")
            .arg("--preserve=xattr")
            .arg(m.backing("genuine"))
            .arg(&victim),
    );
    assert_eq!(fs::metadata(&victim).unwrap().ino(), ino, "same inode");
}

/// The genuine verity file copied over the victim's backing file, with the
/// data changed back to `tampered` (the attacker's bytes).
fn swap_in_keeping(m: &Mount, tampered: &[u8]) {
    copy_genuine_over_victim(m);
    let file = OpenOptions::new()
        .write(true)
        .open(m.backing("victim"))
        .unwrap();
    file.write_all_at(&tampered[..SIZE], 0).unwrap();
}

/// What an attacker with write access to the backing directory does: copy
/// the genuine verity file over the victim's backing file (the same inode,
/// extended attributes included), then change a byte of its data.
fn swap_in_and_tamper(m: &Mount) {
    copy_genuine_over_victim(m);
    flip_byte(&m.backing("victim"), TAMPERED);
}

/// Drops the kernel's cached pages of `file` and reads it whole through it.
fn reread(file: &File) -> io::Result<Vec<u8>> {
    fadvise(file, 0, None, Advice::DontNeed).unwrap();
    let mut buf = vec![0u8; SIZE];
    file.read_exact_at(&mut buf, 0).map(|()| buf)
}

/// Reads `path` whole through a new descriptor.
fn read_new(path: &Path) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    File::open(path)?.read_to_end(&mut buf).map(|_| buf)
}

#[track_caller]
fn assert_eio(result: io::Result<Vec<u8>>, what: &str) {
    match result {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}"),
        Ok(bytes) => panic!(
            "{what}: read {} bytes of a tampered verity file, {}",
            bytes.len(),
            if bytes.get(TAMPERED as usize) == Some(&0) {
                "unverified"
            } else {
                "without EIO"
            }
        ),
    }
}

/// A descriptor opened while the file was ordinary, then every way of
/// reading after the backing store made it verity and tampered with it:
/// the old descriptor (with its cache dropped), a new one, the old one
/// again (trying to put raw bytes back in the cache), a new one again,
/// `O_DIRECT`. All fail with EIO; `lsattr` and `fsverity measure` show the
/// genuine file.
#[test]
fn out_of_band_enable_then_tamper() {
    let m = Mount::new();
    let data = victim_and_genuine(&m);
    let old = File::open(m.path("victim")).unwrap();
    assert_eq!(reread(&old).unwrap(), data);
    swap_in_and_tamper(&m);
    assert_eio(reread(&old), "old descriptor");
    assert_eio(read_new(&m.path("victim")), "new descriptor");
    assert_eio(reread(&old), "old descriptor, cache dropped again");
    assert_eio(read_new(&m.path("victim")), "new descriptor after that");
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("victim"))
        .unwrap();
    assert_eio(reread(&direct), "O_DIRECT");
    assert_eq!(measure(&m.path("victim")), measure(&m.path("genuine")));
    let lsattr = run_ok(Command::new("lsattr").arg(m.path("victim")));
    assert!(lsattr.split_whitespace().next().unwrap().contains('V'));
}

/// Without tampering, descriptors opened before still read the right bytes
/// once the file became verity behind the daemon's back, and writing
/// through one opened for writing is refused (verity files are read-only).
#[test]
fn out_of_band_enable_keeps_old_descriptors_working() {
    let m = Mount::new();
    let data = victim_and_genuine(&m);
    let old = File::open(m.path("victim")).unwrap();
    let writer = OpenOptions::new()
        .write(true)
        .open(m.path("victim"))
        .unwrap();
    copy_genuine_over_victim(&m);
    assert_eq!(reread(&old).unwrap(), data);
    assert_eq!(read_new(&m.path("victim")).unwrap(), data);
    assert_errno(writer.write_at(b"x", 0), libc::EPERM, "write after enable");
}

/// Pages read through a descriptor opened before the file became verity
/// (here, a genuine copy whose stored data is then changed) are gone from
/// the kernel's cache once the daemon has seen the file as verity: a new
/// reader cannot get them even when the attacker's bytes were cached first.
#[test]
fn pages_cached_before_do_not_survive() {
    let m = Mount::new();
    victim_and_genuine(&m);
    // The attacker tampers first and swaps in the verity metadata second:
    // the old descriptor caches the tampered data while the file is
    // still ordinary, which is fine then.
    flip_byte(&m.backing("victim"), TAMPERED);
    let old = File::open(m.path("victim")).unwrap();
    let cached = reread(&old).unwrap();
    assert_ne!(
        cached[TAMPERED as usize],
        read_new(&m.path("genuine")).unwrap()[TAMPERED as usize]
    );
    let victim = m.backing("victim");
    let tampered = fs::read(&victim).unwrap();
    swap_in_keeping(&m, &tampered);
    // The cached pages are the tampered ones; none may be served now.
    assert_eio(read_new(&m.path("victim")), "new descriptor");
    let mut page = vec![0u8; 4096];
    let at = TAMPERED - TAMPERED % 4096;
    assert_eio(
        old.read_exact_at(&mut page, at).map(|()| page),
        "old descriptor, cached page",
    );
}

/// A program holding a descriptor of `argv[1]` (`argv[2]` bytes) opened
/// and mapped before the file becomes verity, driven line by line on
/// stdin: "store" writes through a shared writable mapping at `argv[3]`,
/// "fault" reads that byte through a read-only mapping made (and read,
/// so cached) at the start. It says "ready" and answers "done" to each.
const MAPPER: &str = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
size, at = int(sys.argv[2]), int(sys.argv[3])
shared = mmap.mmap(fd, size, mmap.MAP_SHARED)
reader = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
reader[at]
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "store":
        other = shared[at] ^ 0xff
        for _ in range(100):
            shared[at] = other
        try:
            shared.flush()
        except OSError:
            pass
    elif line.strip() == "fault":
        reader[at]
    print("done", flush=True)
"#;

/// One of these tests' Python programs, driven line by line on stdin: it
/// says "ready" once started, and answers with lines.
struct Program {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Program {
    fn start(script: &str, args: &[&std::ffi::OsStr]) -> Program {
        Program::run(Command::new("/usr/bin/python3"), script, args)
    }

    /// [`Program::start`], as `nobody`.
    fn as_nobody(script: &str, args: &[&std::ffi::OsStr]) -> Program {
        Program::run(as_nobody("/usr/bin/python3"), script, args)
    }

    fn run(mut python: Command, script: &str, args: &[&std::ffi::OsStr]) -> Program {
        let mut child = python
            .args(["-c", script])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting python3");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut program = Program { child, out };
        assert_eq!(program.answer().as_deref(), Some("ready"));
        program
    }

    /// The [`MAPPER`] of the file `path`.
    fn mapper(path: &Path) -> Program {
        let (size, at) = (SIZE.to_string(), TAMPERED.to_string());
        Program::start(MAPPER, &[path.as_os_str(), size.as_ref(), at.as_ref()])
    }

    /// `script` started with the victim's path, its size, the attacker's
    /// offset and `more`.
    fn on_victim(script: &str, m: &Mount, more: &[&str]) -> Program {
        let (path, size, at) = (m.path("victim"), SIZE.to_string(), TAMPERED.to_string());
        let mut args = vec![path.as_os_str(), size.as_ref(), at.as_ref()];
        args.extend(more.iter().map(std::ffi::OsStr::new));
        Program::start(script, &args)
    }

    /// Where its threads wait in the kernel.
    fn kernel_stacks(&self) -> String {
        kernel_stacks(rustix::process::Pid::from_child(&self.child))
    }

    /// Sends `command`; the answer, `None` if the program died.
    fn send(&mut self, command: &str) -> Option<String> {
        use std::io::Write;
        writeln!(self.child.stdin.as_mut().unwrap(), "{command}").ok()?;
        self.answer()
    }

    fn answer(&mut self) -> Option<String> {
        use std::io::BufRead;
        let mut line = String::new();
        self.out.read_line(&mut line).ok()?;
        (!line.is_empty()).then(|| line.trim().to_owned())
    }

    /// Waits for the program to end; its signal, if one killed it.
    fn finish(self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.status().signal()
    }

    /// Sends `command`, then waits for the program to end successfully;
    /// its last answer.
    fn last_answer(mut self, command: &str) -> String {
        let answer = self.send(command).expect("an answer");
        assert!(self.status().success(), "python3 failed");
        answer
    }

    fn status(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        wait_for(&mut self.child, COMMAND_TIMEOUT).expect("python3 did not exit")
    }
}

/// Fails, naming the first differing byte, unless `got` is `want`.
#[track_caller]
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    let diff = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got.len() == want.len() && diff.is_none(),
        "{what}: {} bytes instead of {}, first difference at {diff:?}",
        got.len(),
        want.len()
    );
}

/// Handles opened for writing before the file became verity in the
/// backing store: writes through them (`write(2)`, stores to a shared
/// mapping, `fallocate`) are refused, and what the kernel copied into its
/// page cache before refusing never reaches a reader who opens the verity
/// file after.
#[test]
fn writers_opened_before_cannot_poison_new_readers() {
    let m = Mount::new();
    let data = victim_and_genuine(&m);
    let writer = OpenOptions::new()
        .write(true)
        .open(m.path("victim"))
        .unwrap();
    let mut mapper = Program::mapper(&m.path("victim"));
    copy_genuine_over_victim(&m);
    fs::metadata(m.path("victim")).unwrap();
    assert_eq!(read_new(&m.path("victim")).unwrap(), data);
    let (stop, stopped) = (
        std::sync::Arc::new(AtomicBool::new(false)),
        Ordering::Relaxed,
    );
    let writing = {
        let stop = stop.clone();
        let other = [!data[TAMPERED as usize]];
        std::thread::spawn(move || {
            while !stop.load(stopped) {
                assert_errno(writer.write_at(&other, TAMPERED), libc::EPERM, "write");
            }
            writer
        })
    };
    for _ in 0..200 {
        assert_same(&read_new(&m.path("victim")).unwrap(), &data, "new reader");
    }
    assert_eq!(mapper.send("store").as_deref(), Some("done"));
    for _ in 0..20 {
        assert_same(&read_new(&m.path("victim")).unwrap(), &data, "new reader");
    }
    stop.store(true, stopped);
    let writer = writing.join().unwrap();
    mapper.finish();
    use rustix::fs::FallocateFlags as Mode;
    for (mode, what) in [
        (Mode::empty(), "fallocate past the end"),
        (Mode::PUNCH_HOLE | Mode::KEEP_SIZE, "punching a hole"),
    ] {
        let result = rustix::fs::fallocate(&writer, mode, 0, SIZE as u64 * 2);
        assert_errno(result.map_err(io::Error::from), libc::EPERM, what);
    }
    assert_eq!(read_new(&m.path("victim")).unwrap(), data);
}

/// Sets the modification time of `path` (an attacker covering tracks, so
/// that the kernel's own check of changed attributes sees nothing).
fn set_mtime(path: &Path, mtime: std::time::SystemTime) {
    let times = fs::FileTimes::new().set_modified(mtime);
    let file = File::options().write(true).open(path).unwrap();
    file.set_times(times).unwrap();
}

/// Pages a reader mapped while the file was ordinary, cached, then the
/// backing store makes it verity with other data: once anything meets the
/// file (here a `stat`), the mapping no longer serves the cached page: the
/// fault reaches the daemon, which verifies, and the reader gets SIGBUS.
#[test]
fn mapped_pages_are_invalidated_at_the_switch() {
    let m = Mount::new();
    victim_and_genuine(&m);
    let victim = m.backing("victim");
    let mtime = fs::metadata(&victim).unwrap().modified().unwrap();
    let restore = || set_mtime(&victim, mtime);
    flip_byte(&victim, TAMPERED);
    restore();
    // Attributes cached while ordinary, so the mtime check sees no change.
    std::thread::sleep(Duration::from_millis(1200));
    let mut mapper = Program::mapper(&m.path("victim"));
    let tampered = fs::read(&victim).unwrap();
    swap_in_keeping(&m, &tampered);
    restore();
    std::thread::sleep(Duration::from_millis(1200));
    fs::metadata(m.path("victim")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(mapper.send("fault"), None, "the cached page was served");
    assert_eq!(mapper.finish(), Some(libc::SIGBUS));
}

// ---------------------------------------------------------------------------
// Unprivileged users racing a root daemon
// ---------------------------------------------------------------------------

/// How long each race runs.
fn race_duration() -> Duration {
    let secs = std::env::var("VERITYFS_RACE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    Duration::from_secs_f64(secs)
}

/// An attacker: moves a root-owned object (`argv[3]`) to the name the
/// victim creates through the mount (`argv[4]`) and back, as fast as it
/// can, until the deadline; or, with `argv[3]` "-", plants symbolic links to
/// `/etc/passwd` at the victim's names. Runs in the backing directory as
/// `nobody`.
const ATTACKER: &str = r#"
import os, sys, time
os.chdir(sys.argv[1])
deadline = time.time() + float(sys.argv[2])
src, dst = sys.argv[3], sys.argv[4]
n = 0
while time.time() < deadline:
    for _ in range(100):
        try:
            if src == "-":
                os.symlink("/etc/passwd", dst)
            else:
                os.rename(src, dst)
                os.rename(dst, src)
            n += 1
        except OSError:
            pass
print(n)
"#;

/// The victim: creates files, directories, nodes, symbolic and hard links
/// through the mount as `nobody`, changes the mode, times and extended
/// attributes of its file, renames and removes them, until the deadline.
const CREATOR: &str = r#"
import os, sys, time
os.chdir(sys.argv[1])
deadline = time.time() + float(sys.argv[2])
n = 0
def attempt(f):
    global n
    try:
        f()
        n += 1
    except OSError:
        pass
def create():
    # Non-blocking: the attackers may move the victim's own FIFO (made
    # below) onto "target", and opening a FIFO for writing waits for a
    # reader in the kernel, daemon or not.
    fd = os.open("target", os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)
    try:
        os.write(fd, b"written by nobody")
    finally:
        os.close(fd)
def change():
    os.chmod("target", 0o666)
    os.utime("target", (0, 0))
    os.setxattr("target", "user.mark", b"nobody")
open("mine", "w").close()
while time.time() < deadline:
    attempt(create)
    attempt(change)
    attempt(lambda: os.link("mine", "tlink"))
    attempt(lambda: os.rename("tlink", "target"))
    attempt(lambda: os.unlink("target"))
    attempt(lambda: os.mkdir("tdir", 0o755))
    attempt(lambda: os.rmdir("tdir"))
    attempt(lambda: os.mkfifo("tnod", 0o644))
    attempt(lambda: os.unlink("tnod"))
    attempt(lambda: os.symlink("x", "tsym"))
    attempt(lambda: os.unlink("tsym"))
print(n)
"#;

fn python_as_nobody(script: &str, args: &[&str]) -> std::process::Child {
    as_nobody("/usr/bin/python3")
        .args(["-c", script])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting python3 as nobody")
}

/// The count `child` prints; bounded: a racer stuck in the mount fails the
/// test with where it and the daemon wait.
fn loops(m: &Mount, mut child: std::process::Child, what: &str) -> u64 {
    let limit = race_duration() + Duration::from_secs(60);
    if wait_for(&mut child, limit).is_none() {
        let stuck = kernel_stacks(rustix::process::Pid::from_child(&child));
        let daemon = kernel_stacks(m.daemon_pid()) + &thread_backtraces(m.daemon_pid());
        let _ = child.kill();
        panic!(
            "{what} still running after {limit:?}:\n{stuck}\ndaemon:\n{daemon}\nlog:\n{}",
            m.log()
        );
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{what}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Root-owned objects in a backing directory that `nobody` may write (not
/// sticky), and a mount with `allow_other`: `nobody` renames them into the
/// names it creates through the mount. Nothing root-owned may change owner
/// or contents, no symbolic link may be followed, and everything `nobody`
/// created through the mount is `nobody`'s.
#[test]
fn creation_races_never_hand_over_root_objects() {
    let m = Mount::with_args(&["-o", "allow_other"]);
    let dir = m.backing("shared");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
    fs::write(dir.join("secret"), b"root's secret").unwrap();
    fs::set_permissions(dir.join("secret"), Permissions::from_mode(0o644)).unwrap();
    // `nobody` may legitimately unlink the secret's name in a directory it
    // can write: a second name out of its reach keeps the file to check.
    let private = m.backing("private");
    fs::create_dir(&private).unwrap();
    fs::hard_link(dir.join("secret"), private.join("secret")).unwrap();
    // Not empty, so that it cannot be removed, only renamed.
    fs::create_dir(dir.join("rootdir")).unwrap();
    fs::write(dir.join("rootdir/file"), b"root's").unwrap();
    let passwd = fs::read("/etc/passwd").unwrap();
    let secs = race_duration().as_secs_f64().to_string();
    let backing = dir.to_str().unwrap();
    let attackers: Vec<_> = [
        ["secret", "target"],
        ["rootdir", "tdir"],
        ["secret", "tnod"],
        ["-", "tsym"],
    ]
    .iter()
    .map(|[src, dst]| python_as_nobody(ATTACKER, &[backing, &secs, src, dst]))
    .collect();
    let creator = python_as_nobody(CREATOR, &[m.path("shared").to_str().unwrap(), &secs]);
    let attacks: u64 = attackers
        .into_iter()
        .map(|a| loops(&m, a, "attacker"))
        .sum();
    let creations = loops(&m, creator, "creator");
    eprintln!("{attacks} successful attacks, {creations} successful creations");
    assert!(attacks > 100 && creations > 100, "too few rounds to race");
    let secret = fs::metadata(private.join("secret")).unwrap();
    assert_eq!(
        (secret.uid(), secret.gid(), secret.mode() & 0o7777),
        (0, 0, 0o644)
    );
    assert_ne!(secret.mtime(), 0, "times changed");
    assert!(
        get_xattr(&private.join("secret"), "user.mark").is_err(),
        "xattr set"
    );
    assert_eq!(fs::read(private.join("secret")).unwrap(), b"root's secret");
    let rootdir = ["rootdir", "tdir"]
        .iter()
        .filter_map(|n| fs::symlink_metadata(dir.join(n)).ok())
        .filter(|meta| meta.uid() == 0 && meta.is_dir())
        .count();
    assert_eq!(rootdir, 1, "the root-owned directory is still root's");
    assert_eq!(fs::read("/etc/passwd").unwrap(), passwd);
    for entry in fs::read_dir(&dir).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        assert!(meta.uid() == 0 || meta.uid() == NOBODY && meta.gid() == NOBODY);
    }
}

// ---------------------------------------------------------------------------
// Reserved blocks
// ---------------------------------------------------------------------------

/// A small ext4 filesystem on a loop device of its own, mounted for the
/// test and removed after it.
struct SmallExt4 {
    dir: tempfile::TempDir,
}

impl SmallExt4 {
    fn new() -> SmallExt4 {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("image");
        File::create(&image).unwrap().set_len(32 << 20).unwrap();
        run_ok(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "10"])
                .arg(&image),
        );
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(&mnt),
        );
        SmallExt4 { dir }
    }

    fn mnt(&self) -> std::path::PathBuf {
        self.dir.path().join("mnt")
    }

    /// Free blocks, and those available to unprivileged users.
    fn free(&self) -> (u64, u64) {
        let st = rustix::fs::statvfs(self.mnt()).unwrap();
        (st.f_bfree, st.f_bavail)
    }
}

impl Drop for SmallExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mnt()).status();
    }
}

/// Fills the filesystem as `nobody` with `dd` writing to `target`; returns
/// whether dd ended with "No space left on device".
fn fill_as_nobody(target: &Path) -> bool {
    let out = run(as_nobody("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", target.display())));
    String::from_utf8_lossy(&out.stderr).contains("No space left on device")
}

/// Writes 4 MiB through a shared writable mapping of a new file, as
/// `nobody`.
fn map_as_nobody(path: &Path) {
    let script = "import mmap, os, sys\n\
                  fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)\n\
                  os.ftruncate(fd, 4 << 20)\n\
                  m = mmap.mmap(fd, 4 << 20, mmap.MAP_SHARED)\n\
                  for off in range(0, 4 << 20, 4096): m[off] = 1\n\
                  try: m.flush()\n\
                  except OSError: pass\n";
    // The stores themselves must happen: a program that failed to run
    // would leave the reserved blocks free for the wrong reason.
    run_ok(as_nobody("/usr/bin/python3").args(["-c", script]).arg(path));
}

/// `nobody` fills a small ext4 through the mount, with `write(2)` and
/// through a shared mapping: the blocks reserved for root stay free,
/// exactly as when `nobody` writes directly.
#[test]
fn writes_through_the_mount_respect_reserved_blocks() {
    let ext4 = SmallExt4::new();
    let backing = ext4.mnt().join("backing");
    fs::create_dir(&backing).unwrap();
    fs::set_permissions(&backing, Permissions::from_mode(0o777)).unwrap();
    let (free_before, _) = ext4.free();
    assert!(fill_as_nobody(&backing.join("direct")));
    let (free_direct, avail_direct) = ext4.free();
    assert!(avail_direct < 16, "{avail_direct} blocks still available");
    assert!(
        free_direct > free_before / 20,
        "{free_direct} of {free_before} blocks free"
    );
    fs::remove_file(backing.join("direct")).unwrap();
    let m = Mount::of_backing(&backing, &["-o", "allow_other"]);
    assert!(fill_as_nobody(&m.path("through")));
    // The kernel writes shared mappings back without credentials.
    map_as_nobody(&m.path("mapped"));
    let (free_mount, _) = ext4.free();
    assert!(
        free_mount + 16 >= free_direct,
        "through the mount: {free_mount} blocks left, directly: {free_direct}"
    );
}

/// The size the kernel caches at a lookup comes from the location record
/// alone. An attacker who owns the backing file (a genuine verity copy)
/// shows a short record to a `stat`, then puts the genuine one back before
/// the open: the open must not leave the kernel with the short size, or a
/// reader gets a prefix of the file (a script cut short) from a descriptor
/// whose measure is the genuine file's.
#[test]
fn size_shown_at_lookup_cannot_truncate_the_file() {
    use verityfs::layout::LOCATION_XATTR;
    use verityfs::Location;
    let mut m = Mount::new();
    let data = random_bytes(SIZE, 9);
    fs::write(m.path("victim"), &data).unwrap();
    enable(&m.path("victim"), &[]);
    let genuine = measure(&m.path("victim"));
    // A new daemon: nothing of the file is open or pinned.
    m.remount(&[]);
    let backing = m.backing("victim");
    let record = get_xattr(&backing, LOCATION_XATTR).unwrap();
    let real = Location::decode(&record).unwrap();
    let short = Location::new(17, real.tree_size, real.desc_size).unwrap();
    let set = |value: &[u8]| {
        rustix::fs::setxattr(
            &backing,
            LOCATION_XATTR,
            value,
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap()
    };
    set(&short.encode());
    assert_eq!(fs::metadata(m.path("victim")).unwrap().len(), 17);
    set(&record);
    let mut file = File::open(m.path("victim")).unwrap();
    let digest = verity_ioctl(&file, VerityIoctl::Measure { digest_size: 64 }).unwrap();
    assert_eq!(format_digest(&digest).unwrap(), genuine);
    let mut read = Vec::new();
    file.read_to_end(&mut read).unwrap();
    assert!(
        read == data,
        "read {} bytes of a {SIZE}-byte verity file measured as the genuine one",
        read.len()
    );
}

/// A program that maps `argv[1]` (`argv[2]` bytes) read-only and reads the
/// byte at `argv[3]` (so its page is cached and mapped), says "ready", and
/// on "go" measures the file, through a new descriptor or (`argv[4]`
/// "old") through the one it mapped, then at once reads the mapped byte
/// again. It prints the digest and that byte.
const MEASURE_THEN_FAULT: &str = r#"
import fcntl, mmap, os, sys
path, size, at, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
fd = os.open(path, os.O_RDONLY)
mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
mapped[at]
print("ready", flush=True)
sys.stdin.readline()
target = fd if how == "old" else os.open(path, os.O_RDONLY)
arg = bytearray(4 + 64)
arg[2] = 64
fcntl.ioctl(target, 0xc0046686, arg, True)
byte = mapped[at]
print(arg[4:4 + arg[2]].hex(), byte, flush=True)
"#;

/// A mapping made while the file was ordinary, whose page holds the
/// attacker's byte; the genuine verity file is then copied over it in the
/// backing store. Once `fsverity measure` answers with the genuine digest,
/// through a new descriptor or the mapped one, the mapping must show the
/// genuine byte: what was measured is what is read.
#[test]
fn a_measure_answers_only_once_old_mapped_pages_are_gone() {
    let m = Mount::new();
    let (data, genuine, tampered) = genuine_and_tampered(&m);
    let at = TAMPERED as usize;
    // A reply sent before the drop is done shows within a few rounds.
    for round in 0..60 {
        let how = if round % 3 == 0 { "new" } else { "old" };
        fs::write(m.path("victim"), &tampered).unwrap();
        let program = Program::on_victim(MEASURE_THEN_FAULT, &m, &[how]);
        copy_genuine_over_victim(&m);
        let line = program.last_answer("go");
        let (digest, byte) = line.split_once(' ').expect("digest and byte");
        assert_eq!(format!("sha256:{digest}"), genuine, "round {round} ({how})");
        assert_eq!(
            byte.parse::<u8>().unwrap(),
            data[at],
            "round {round}: the mapping showed the old page after a measure through the {how} descriptor"
        );
        fs::remove_file(m.path("victim")).unwrap();
    }
}

/// A program holding a read-only mapping of `argv[1]` (`argv[2]` bytes),
/// whose byte at `argv[3]` it reads (so its page is cached), and a shared
/// writable mapping of it, made while the file is ordinary. On "go" (the
/// file is now verity in the backing store) it measures through its old
/// descriptor and through a new one, stores a byte through its writable
/// mapping, closes it, measures through a new descriptor again, and reads
/// the byte through the old mapping and the old descriptor. It prints the
/// three measures (digest or errno name) and the two bytes.
const WRITER_THEN_MEASURE: &str = r#"
import errno, fcntl, mmap, os, sys
path, size, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def measure(fd):
    arg = bytearray(4 + 64)
    arg[2] = 64
    try:
        fcntl.ioctl(fd, 0xc0046686, arg, True)
        return arg[4:4 + arg[2]].hex()
    except OSError as e:
        return errno.errorcode[e.errno]
fd = os.open(path, os.O_RDONLY)
mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
mapped[at]
wfd = os.open(path, os.O_RDWR)
writable = mmap.mmap(wfd, size, mmap.MAP_SHARED)
print("ready", flush=True)
sys.stdin.readline()
out = [measure(fd), measure(os.open(path, os.O_RDONLY))]
writable[at] = mapped[at] ^ 0x55
try:
    writable.flush()
except OSError:
    pass
writable.close()
os.close(wfd)
out += [measure(os.open(path, os.O_RDONLY)), str(mapped[at]), str(os.pread(fd, 1, at)[0])]
print(" ".join(out), flush=True)
"#;

/// A file mapped while ordinary, and opened and mapped for writing too,
/// then made verity in the backing store. Its old kernel inode can take
/// the writer's stores into its cache even after the switch (the kernel
/// copies them before the daemon refuses them), so nothing may call the
/// file verity while they can show: a measure through the old descriptor
/// fails (`ESTALE`), and through a new one (a new inode) too while the
/// writer is open (`ETXTBSY`, as the kernel refuses an enable with writers).
/// Once the writer is gone, a measure gives the genuine digest, and only
/// after the old mapping and descriptor show the genuine byte.
#[test]
fn writers_opened_before_keep_the_file_from_being_measured() {
    let m = Mount::new();
    let (data, genuine, tampered) = genuine_and_tampered(&m);
    let at = TAMPERED as usize;
    fs::write(m.path("victim"), &tampered).unwrap();
    let program = Program::on_victim(WRITER_THEN_MEASURE, &m, &[]);
    copy_genuine_over_victim(&m);
    let line = program.last_answer("go");
    let genuine_hex = genuine.strip_prefix("sha256:").unwrap();
    let byte = data[at].to_string();
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["ESTALE", "ETXTBSY", genuine_hex, &byte, &byte],
        "measures through the old descriptor, a new one with the writer open, \
         a new one after; the byte through the old mapping and descriptor \
         (genuine: {})",
        data[at]
    );
}

/// Inodes retired one after another, the file made ordinary and verity
/// again in the backing store in between: when the kernel forgets the
/// newest one, the next inode must still answer for the oldest one's
/// writers (`ETXTBSY` while they are open), not call the file verity while
/// their stores can still show in mappings of it.
#[test]
fn a_forgotten_retired_inode_keeps_older_writers_in_view() {
    use verityfs::layout::LOCATION_XATTR;
    let m = Mount::new();
    let data = victim_and_genuine(&m);
    let genuine = measure(&m.path("genuine"));
    fs::write(m.path("victim"), &data).unwrap();
    let write = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.path("victim"))
            .unwrap()
    };
    let measure_new = || {
        let file = File::open(m.path("victim")).unwrap();
        verity_ioctl(&file, VerityIoctl::Measure { digest_size: 64 })
            .map(|out| format_digest(&out).unwrap())
    };
    // The first inode: a writer, then the switch, which retires it.
    let first_writer = write();
    copy_genuine_over_victim(&m);
    let retired = verity_ioctl(&first_writer, VerityIoctl::Measure { digest_size: 64 });
    assert_errno(retired, libc::ESTALE, "measure through the first inode");
    // Ordinary again: the next inode gets a writer, then verity again, and
    // the switch retires it too.
    let backing = m.backing("victim");
    let record = get_xattr(&backing, LOCATION_XATTR).unwrap();
    rustix::fs::removexattr(&backing, LOCATION_XATTR).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let second_writer = write();
    rustix::fs::setxattr(
        &backing,
        LOCATION_XATTR,
        &record,
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    let retired = verity_ioctl(&second_writer, VerityIoctl::Measure { digest_size: 64 });
    assert_errno(retired, libc::ESTALE, "measure through the second inode");
    drop(second_writer);
    // The kernel forgets the second inode (its last writer is gone).
    std::thread::sleep(Duration::from_millis(300));
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_errno(
        measure_new(),
        libc::ETXTBSY,
        "measure with the first writer open",
    );
    drop(first_writer);
    assert_eq!(
        measure_new().unwrap(),
        genuine,
        "measure once the writers are gone"
    );
}

/// Holds a write lease on `argv[1]` (as a writer of the backing store may),
/// ignoring the signal that asks to give it up, until stdin closes.
const LEASE_HOLDER: &str = r#"
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
print("ready", flush=True)
sys.stdin.read()
"#;

/// A lease on a backing file makes an open of it wait for the holder (45 s
/// by default): opens through the mount fail at once instead (`EAGAIN`),
/// so that the holder cannot tie up the daemon's threads, and the inode's
/// lock, which every `stat` of the file needs too.
#[test]
fn a_lease_on_a_backing_file_cannot_stall_the_daemon() {
    let mut m = Mount::new();
    let data = random_bytes(SIZE, 11);
    for name in ["plain", "verity", "other"] {
        fs::write(m.path(name), &data).unwrap();
    }
    enable(&m.path("verity"), &[]);
    // A new daemon: it has opened none of them.
    m.remount(&[]);
    let holders: Vec<_> = ["plain", "verity"]
        .iter()
        .map(|name| Program::start(LEASE_HOLDER, &[m.backing(name).as_os_str()]))
        .collect();
    let (plain, verity, other) = (m.path("plain"), m.path("verity"), m.path("other"));
    with_watchdog(
        "opens of leased files",
        Duration::from_secs(10),
        move || {
            for path in [&plain, &verity] {
                for _ in 0..4 {
                    assert_errno(File::open(path), libc::EAGAIN, "open of a leased file");
                    fs::metadata(path).unwrap();
                }
            }
            assert_eq!(fs::read(other).unwrap().len(), SIZE);
        },
    );
    for holder in holders {
        holder.finish();
    }
    assert_eq!(fs::read(m.path("verity")).unwrap(), data);
    assert_eq!(fs::read(m.path("plain")).unwrap(), data);
}

/// Run by `nobody`: `write(2)`s to a backing file from a buffer mapped
/// through the mount from the same file, while two threads either truncate
/// it through the mount or, given an enabling record, put the record back
/// on the backing file and open it for writing through the mount (whose
/// daemon undoes the enable it seems to be). The write holds the backing inode's lock
/// while its page fault waits for a read through the mount, and the
/// truncations and undoings wait for that lock in the daemon. Says how many
/// writes were done in the time given, or at which one it was stuck.
const SELF_FEEDER: &str = r#"
import mmap, os, sys, threading, time
path, backing, size, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
fd = os.open(path, os.O_RDWR)
out = os.open(backing, os.O_WRONLY)
view = memoryview(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ))
record = bytes.fromhex(sys.argv[5]) if len(sys.argv) > 5 else None
def wait_in_daemon():
    while True:
        try:
            if record is None:
                os.ftruncate(fd, size)
            else:
                os.setxattr(backing, "user.verityfs.enabling", record)
                os.close(os.open(path, os.O_RDWR))
        except OSError: pass
for _ in range(2):
    threading.Thread(target=wait_in_daemon, daemon=True).start()
print("ready", flush=True)
writes, end = 0, time.time() + secs
while time.time() < end:
    at = (writes * 7919 % (size >> 20)) << 20
    os.posix_fadvise(out, 0, 0, os.POSIX_FADV_DONTNEED)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    done = threading.Event()
    def write():
        os.pwrite(out, view[at:at + 4096], at)
        done.set()
    threading.Thread(target=write, daemon=True).start()
    if not done.wait(5):
        print(f"stuck at write {writes + 1}", flush=True)
        os._exit(0)
    writes += 1
print(f"{writes} writes", flush=True)
os._exit(0)
"#;

/// No request waits, holding what others need, for a backing system call
/// that waits for the backing inode's lock: here the write of
/// [`SELF_FEEDER`] holds it until a read of the file through the mount is
/// answered, which needs the verity state that truncations and the undoing
/// of an interrupted enable hold. Alone, `nobody` would stop the daemon's
/// workers for good.
#[test]
fn a_write_from_a_mapping_of_the_mount_cannot_stall_the_daemon() {
    let m = Mount::with_args(&["-o", "allow_other"]);
    let size = 16usize << 20;
    fs::write(m.path("other"), b"another file").unwrap();
    let record = verityfs::EnablingRecord {
        data_size: size as u64,
    };
    let record: String = record.encode().iter().map(|b| format!("{b:02x}")).collect();
    for (name, waits) in [("truncated", None), ("undone", Some(&record))] {
        fs::write(m.path(name), random_bytes(size, 3)).unwrap();
        std::os::unix::fs::chown(m.backing(name), Some(NOBODY), Some(NOBODY)).unwrap();
        let (path, backing) = (m.path(name), m.backing(name));
        let (size, secs) = (size.to_string(), "3".to_owned());
        let mut args = vec![
            path.as_os_str(),
            backing.as_os_str(),
            size.as_ref(),
            secs.as_ref(),
        ];
        args.extend(waits.map(std::ffi::OsStr::new));
        let mut feeder = Program::as_nobody(SELF_FEEDER, &args);
        let answer = feeder.answer().expect("an answer");
        assert!(answer.ends_with(" writes"), "{name}: {answer}");
        assert!(feeder.status().success(), "python3 failed");
        let other = m.path("other");
        let read = with_watchdog("a read after", Duration::from_secs(10), move || {
            fs::read(other)
        });
        assert_eq!(read.unwrap(), b"another file");
    }
}

/// Run by `nobody`: creates names through the mount (`O_CREAT`) while
/// another thread makes a FIFO of the same name in the backing directory,
/// often between the kernel's lookup and its create. Says how many
/// creations failed, by error.
const FIFO_PLANTER: &str = r#"
import collections, os, sys, threading
mounted, backing, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
errors = collections.Counter()
for i in range(rounds):
    name = f"f{i}"
    def plant():
        for _ in range(i % 200): pass
        try: os.mkfifo(os.path.join(backing, name), 0o666)
        except OSError: pass
    planter = threading.Thread(target=plant)
    planter.start()
    try: os.close(os.open(os.path.join(mounted, name), os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK, 0o644))
    except OSError as e: errors[e.strerror] += 1
    planter.join()
    os.unlink(os.path.join(backing, name))
print(dict(errors), flush=True)
"#;

/// A FIFO put where the kernel's lookup found nothing, before its create:
/// the create fails (the kernel accepts only a regular file from it), and
/// the daemon keeps no descriptor of it, else `nobody` could exhaust its
/// descriptors and stop every creation and open through the mount.
#[test]
fn a_fifo_planted_before_a_create_costs_the_daemon_nothing() {
    let m = Mount::with_args(&["-o", "allow_other"]);
    let dir = m.backing("fifos");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
    let descriptors = || {
        fs::read_dir(format!("/proc/{}/fd", m.daemon_pid()))
            .unwrap()
            .count()
    };
    let before = descriptors();
    let out = python_as_nobody(
        FIFO_PLANTER,
        &[
            m.path("fifos").to_str().unwrap(),
            dir.to_str().unwrap(),
            "2000",
        ],
    )
    .wait_with_output()
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let errors = String::from_utf8_lossy(&out.stdout);
    eprintln!("creations failed: {errors}");
    assert_ne!(errors.trim(), "{}", "the FIFO never came first");
    // The kernel forgets the FIFOs its lookups found: what stays is leaked.
    drop_caches();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while descriptors() >= before + 10 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = descriptors();
    assert!(
        after < before + 10,
        "the daemon had {before} descriptors, {after} after"
    );
    let enxio_only = errors.starts_with("{'No such device or address': ") && !errors.contains(',');
    assert!(
        enxio_only,
        "creations failed otherwise than with ENXIO: {errors}"
    );
}

/// Run by `nobody`: stats every file of a directory through the mount,
/// then says how many stats failed.
const STATTER: &str = r#"
import os, sys
names = os.listdir(sys.argv[1])
failed = 0
for name in names:
    try: os.stat(os.path.join(sys.argv[1], name))
    except OSError: failed += 1
print(f"{failed} of {len(names)} failed", flush=True)
"#;

/// Each inode the kernel holds costs the daemon a descriptor, for as long
/// as the kernel keeps it: `nobody` statting a few thousand files through
/// the mount must not run a daemon started with the usual soft limit
/// (1024) out of descriptors, which would fail everybody's lookups and
/// creations until the kernel forgets.
#[test]
fn many_files_looked_up_cannot_exhaust_the_daemon_s_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let (backing, wrapper) = (dir.path().join("backing"), dir.path().join("verityfs"));
    fs::create_dir(&backing).unwrap();
    fs::set_permissions(&backing, Permissions::from_mode(0o755)).unwrap();
    let script = format!("#!/bin/sh\nulimit -Sn 1024\nexec {VERITYFS} \"$@\"\n");
    fs::write(&wrapper, script).unwrap();
    fs::set_permissions(&wrapper, Permissions::from_mode(0o755)).unwrap();
    let m = Mount::over(&backing, &wrapper, MOUNT_TIMEOUT, &["-o", "allow_other"]);
    fs::create_dir(m.backing("many")).unwrap();
    for i in 0..3000 {
        File::create(m.backing(&format!("many/{i}"))).unwrap();
    }
    let many = m.path("many");
    let out = python_as_nobody(STATTER, &[many.to_str().unwrap()])
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0 of 3000 failed"
    );
    fs::write(m.path("created"), b"by root").unwrap();
    assert_eq!(fs::read(m.path("created")).unwrap(), b"by root");
}

/// Run as root (`/dev/fuse` is root's here; most systems let any user run
/// a FUSE filesystem): writes to each backing file given from a buffer
/// mapped from the file of another mount, a page apart (a read each), once
/// told to ("go": it says "started"), then says "done" once the writes
/// end. While that mount's daemon is stopped, each write holds its backing
/// file's inode lock. The mapping is read at random: each fault is then one
/// READ, asked for under the lock (no readahead, which could send several
/// per fault), so READs waiting count the locks held.
const LOCK_HOLDER: &str = r#"
import mmap, os, sys, threading
fd = os.open(sys.argv[1], os.O_RDONLY)
mapping = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
mapping.madvise(mmap.MADV_RANDOM)
view = memoryview(mapping)
def hold(i, target):
    out = os.open(target, os.O_WRONLY)
    os.pwrite(out, view[i << 12:(i + 1) << 12], 0)
writers = [threading.Thread(target=hold, args=(i, t)) for i, t in enumerate(sys.argv[2:])]
print("ready", flush=True)
sys.stdin.readline()
for writer in writers: writer.start()
print("started", flush=True)
for writer in writers: writer.join()
print("done", flush=True)
"#;

/// The kernel's FUSE connections (`fusectl`), mounted for a test.
struct Connections(tempfile::TempDir);

impl Connections {
    fn mount() -> Connections {
        let dir = tempfile::tempdir().unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "fusectl", "fusectl"])
                .arg(dir.path()),
        );
        Connections(dir)
    }

    /// Waits until the connection `dev` (a mount's device number) has at
    /// least `n` requests waiting for their answers; fails with `report()`
    /// if they do not come.
    fn wait_for_waiting(&self, dev: u64, n: usize, report: impl Fn() -> String) {
        let path = self.0.path().join(dev.to_string()).join("waiting");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: usize = fs::read_to_string(&path).unwrap().trim().parse().unwrap();
            if waiting >= n {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{waiting} requests waiting, not {n}:\n{}",
                report()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A process stopped with SIGSTOP, continued when dropped.
struct Stopped(rustix::process::Pid);

impl Stopped {
    /// Returns once every thread of `pid` has stopped: `kill` returns
    /// before, and until one of its threads takes the signal the others go
    /// on serving.
    fn new(pid: rustix::process::Pid) -> Stopped {
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
        let stopped = Stopped(pid);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !stopped.all_stopped() {
            assert!(
                std::time::Instant::now() < deadline,
                "not stopped:\n{}",
                kernel_stacks(pid)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        stopped
    }

    fn all_stopped(&self) -> bool {
        let tasks = format!("/proc/{}/task", self.0.as_raw_nonzero());
        fs::read_dir(tasks).unwrap().flatten().all(|task| {
            let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the command's closing parenthesis.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.0, rustix::process::Signal::CONT);
    }
}

/// Files of mount `a` whose backing inode locks are held (by writes to
/// them faulting on a mapping of mount `b`, whose daemon is stopped) until
/// released.
struct Held {
    holder: Program,
    stopped: Stopped,
    connections: Connections,
}

impl Held {
    /// Holds the locks of `files` (backing paths of `a`).
    fn new(b: &Mount, files: &[PathBuf]) -> Held {
        fs::write(b.backing("source"), random_bytes(files.len() << 12, 9)).unwrap();
        let connections = Connections::mount();
        // Its root's attributes are asked of its daemon: not once stopped.
        let device = device(b);
        let source = b.path("source");
        let mut args = vec![source.as_os_str()];
        args.extend(files.iter().map(|f| f.as_os_str()));
        let mut holder = Program::start(LOCK_HOLDER, &args);
        let stopped = Stopped::new(b.daemon_pid());
        assert_eq!(holder.send("go").as_deref(), Some("started"));
        connections.wait_for_waiting(device, files.len(), || {
            holder.kernel_stacks() + "daemon:\n" + &kernel_stacks(b.daemon_pid())
        });
        Held {
            holder,
            stopped,
            connections,
        }
    }

    /// Waits until the connection of `m`, whose device number is `device`,
    /// has `n` requests waiting. (Read before: the stat of its root may
    /// be a request, taking one of fuser's threads for a moment.)
    fn wait_for_requests(&self, m: &Mount, device: u64, n: usize) {
        self.connections.wait_for_waiting(device, n, || {
            self.holder.kernel_stacks() + "daemon:\n" + &kernel_stacks(m.daemon_pid())
        });
    }

    /// Continues `b`'s daemon: the writes, and what waited for them, end.
    fn release(self) {
        let Held {
            mut holder,
            stopped,
            connections,
        } = self;
        drop(stopped);
        assert_eq!(holder.answer().as_deref(), Some("done"));
        assert!(holder.status().success());
        drop(connections);
    }
}

/// The device number of mount `m`: its connection's name.
fn device(m: &Mount) -> u64 {
    fs::metadata(&m.mnt).unwrap().dev()
}

/// Requests that wait in the backing store for as long as someone else
/// decides (here truncations of files whose inode locks are held by writes
/// faulting on a mapping of a stopped FUSE filesystem) hold at most all but
/// one of fuser's threads: the mount goes on serving other requests.
#[test]
fn requests_stuck_in_the_backing_store_leave_the_mount_serving() {
    const HELD: usize = 8;
    let (a, b) = (Mount::new(), Mount::new());
    let held: Vec<String> = (0..HELD).map(|i| format!("held{i}")).collect();
    for name in &held {
        fs::write(a.path(name), b"x").unwrap();
    }
    fs::write(a.path("other"), b"another file").unwrap();
    let files: Vec<PathBuf> = held.iter().map(|name| a.backing(name)).collect();
    let device = device(&a);
    let locks = Held::new(&b, &files);
    let truncations: Vec<_> = held
        .iter()
        .map(|name| {
            let path = a.path(name);
            std::thread::spawn(move || OpenOptions::new().write(true).open(path)?.set_len(0))
        })
        .collect();
    locks.wait_for_requests(&a, device, HELD);
    let other = a.path("other");
    let read = with_watchdog(
        "a read with truncations stuck",
        Duration::from_secs(10),
        move || fs::read(other),
    );
    assert_eq!(read.unwrap(), b"another file");
    locks.release();
    for truncation in truncations {
        truncation.join().unwrap().unwrap();
    }
}

/// Opens each file named for writing, then, told to ("go": it says
/// "started"), truncates each in a thread of its own, and says "done" once
/// all are (or how many failed, and how).
const TRUNCATOR: &str = r#"
import os, sys, threading
errors = []
def truncate(fd):
    try: os.ftruncate(fd, 0)
    except OSError as e: errors.append(e)
fds = [os.open(path, os.O_WRONLY) for path in sys.argv[1:]]
threads = [threading.Thread(target=truncate, args=(fd,)) for fd in fds]
print("ready", flush=True)
sys.stdin.readline()
for thread in threads: thread.start()
print("started", flush=True)
for thread in threads: thread.join()
failed = sorted({os.strerror(e.errno) for e in errors})
print(f"{len(errors)} failed: {', '.join(failed)}" if errors else "done", flush=True)
"#;

/// `nobody`'s truncations (by [`TRUNCATOR`]) of files of its own in
/// `shared`, a directory of mount `a` that all may write, stuck in the
/// backing store: their locks held (see [`Held`]) with mount `b`.
struct StuckTruncations {
    locks: Held,
    truncator: Program,
}

impl StuckTruncations {
    /// Truncates `n` files, once `stuck` requests of `a` wait.
    fn start(a: &Mount, b: &Mount, n: usize, stuck: usize) -> StuckTruncations {
        let dir = a.backing("shared");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, Permissions::from_mode(0o777)).unwrap();
        let names: Vec<String> = (0..n).map(|i| format!("shared/held{i}")).collect();
        let files: Vec<PathBuf> = names.iter().map(|name| a.backing(name)).collect();
        for file in &files {
            fs::write(file, b"x").unwrap();
            std::os::unix::fs::chown(file, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        let paths: Vec<PathBuf> = names.iter().map(|name| a.path(name)).collect();
        let args: Vec<&std::ffi::OsStr> = paths.iter().map(|p| p.as_os_str()).collect();
        let mut truncator = Program::as_nobody(TRUNCATOR, &args);
        let device = device(a);
        let locks = Held::new(b, &files);
        assert_eq!(truncator.send("go").as_deref(), Some("started"));
        locks.wait_for_requests(a, device, stuck);
        StuckTruncations { locks, truncator }
    }

    /// Releases the locks; what the truncator says once its truncations end.
    fn end(self) -> String {
        let StuckTruncations {
            locks,
            mut truncator,
        } = self;
        locks.release();
        let answer = truncator.answer().expect("the truncator's answer");
        assert!(truncator.status().success());
        answer
    }
}

/// A user with many requests stuck in the backing store (truncations of
/// 72 files whose inode locks are held) holds no lock other users need: in
/// the directory of those files, that user's lookups, root's creations and
/// root's reads of the files are answered. (Counted by user, more than 64
/// of them, the user's lookup would wait behind its truncations, holding
/// the directory's lock that root's creation needs.)
#[test]
fn a_user_s_stuck_requests_leave_shared_directories_to_others() {
    const HELD: usize = 72;
    let (a, b) = (Mount::with_args(&["-o", "allow_other"]), Mount::new());
    let stuck = StuckTruncations::start(&a, &b, HELD, HELD);
    let missing = a.path("shared/missing");
    let lookup = with_watchdog(
        "a lookup by the user whose requests are stuck",
        Duration::from_secs(10),
        move || run(as_nobody("/usr/bin/stat").arg(missing)),
    );
    assert!(
        String::from_utf8_lossy(&lookup.stderr).contains("No such file"),
        "{lookup:?}"
    );
    let (new, other) = (a.path("shared/root's"), a.path("shared/held0"));
    let created = with_watchdog(
        "root's creation and read beside them",
        Duration::from_secs(10),
        move || fs::write(&new, b"root's").and_then(|()| fs::read(other)),
    );
    // Reads wait for no inode lock, on a local filesystem or here.
    assert_eq!(created.unwrap(), b"x");
    assert_eq!(stuck.end(), "done");
}

/// A user's requests stuck in the backing store take at most a quarter of
/// the workers: beyond 256 handed over, that user's next requests fail at
/// once (`EIO`) rather than wait, while other users are served.
#[test]
fn a_user_s_stuck_requests_take_a_bounded_share_of_the_workers() {
    const HELD: usize = 300;
    // fuser's threads that serve requests themselves, and the user's share.
    const SERVED: usize = 3 + 256;
    let (a, b) = (Mount::with_args(&["-o", "allow_other"]), Mount::new());
    fs::write(a.path("other"), b"another file").unwrap();
    let stuck = StuckTruncations::start(&a, &b, HELD, SERVED);
    let other = a.path("other");
    let read = with_watchdog("root's read", Duration::from_secs(10), move || {
        fs::read(other)
    });
    assert_eq!(read.unwrap(), b"another file");
    let failed = HELD - SERVED;
    assert_eq!(
        stuck.end(),
        format!("{failed} failed: {}", strerror(libc::EIO))
    );
}
