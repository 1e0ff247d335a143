//! The mount as a passthrough: ordinary files, directories and mount
//! options must behave exactly as on the backing filesystem (and as other
//! FUSE passthroughs do). The last test runs one scripted sequence of
//! generic operations both directly on the backing filesystem and through
//! the mount, and compares everything observable.

mod common;

use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{Dir, Timespec, Timestamps, XattrFlags};

use common::*;

/// The names and inode numbers `readdir` gives for `dir`.
fn dir_entries(dir: &Path) -> Vec<(String, u64)> {
    let fd = File::open(dir).unwrap();
    let mut out: Vec<_> = Dir::read_from(fd.as_fd())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.ino())
        })
        .collect();
    out.sort();
    out
}

// ---------------------------------------------------------------------------
// Times, directories, O_DIRECT, inode numbers, flags
// ---------------------------------------------------------------------------

#[test]
fn times_before_1970_pass_through_both_ways() {
    let m = Mount::new();
    let f = m.path("old");
    fs::write(&f, b"x").unwrap();
    run_ok(Command::new("touch").args(["-t", "196001010101"]).arg(&f));
    let through = fs::metadata(&f).unwrap();
    let direct = fs::metadata(m.backing("old")).unwrap();
    assert!(direct.mtime() < 0, "stored {}", direct.mtime());
    assert_eq!(through.mtime(), direct.mtime());
    // Fractional times before 1970, set through the mount and directly.
    let stamp = |sec, nsec| Timestamps {
        last_access: Timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        last_modification: Timespec {
            tv_sec: sec - 7,
            tv_nsec: nsec,
        },
    };
    for (sec, nsec) in [(-2, 500_000_000), (-1, 1), (-100_000_000, 999_999_999)] {
        let flags = rustix::fs::AtFlags::empty();
        rustix::fs::utimensat(rustix::fs::CWD, &f, &stamp(sec, nsec), flags).unwrap();
        let direct = fs::metadata(m.backing("old")).unwrap();
        assert_eq!((direct.atime(), direct.atime_nsec()), (sec, nsec));
        assert_eq!((direct.mtime(), direct.mtime_nsec()), (sec - 7, nsec));
        let g = m.backing("old");
        rustix::fs::utimensat(rustix::fs::CWD, &g, &stamp(sec - 1, nsec), flags).unwrap();
        // The mount's cached attributes last a second at most.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let through = fs::metadata(&f).unwrap();
        assert_eq!((through.atime(), through.atime_nsec()), (sec - 1, nsec));
        assert_eq!((through.mtime(), through.mtime_nsec()), (sec - 8, nsec));
    }
}

#[test]
fn rewinddir_lists_entries_created_meanwhile() {
    let m = Mount::new();
    fs::write(m.path("first"), b"").unwrap();
    let mut dir = Dir::new(File::open(&m.mnt).unwrap()).unwrap();
    let names = |dir: &mut Dir| -> Vec<String> {
        let mut names: Vec<String> = std::iter::from_fn(|| dir.read())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&mut dir), ["first"]);
    fs::write(m.path("second"), b"").unwrap();
    dir.rewind();
    assert_eq!(names(&mut dir), ["first", "second"]);
    fs::remove_file(m.path("first")).unwrap();
    dir.seek(0).unwrap();
    assert_eq!(names(&mut dir), ["second"]);
}

#[test]
fn o_direct_writes_and_reads() {
    let m = Mount::new();
    let page = page_size();
    // A buffer aligned as O_DIRECT wants on the backing filesystem.
    let mut raw = vec![0u8; 4 * page];
    let start = raw.as_ptr().align_offset(page);
    let buf = &mut raw[start..start + 2 * page];
    buf.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let data = buf.to_vec();
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(m.path("direct"))
        .unwrap();
    f.write_all_at(buf, 0).unwrap();
    f.write_all_at(&buf[..page], 2 * page as u64).unwrap();
    buf.fill(0);
    f.read_exact_at(buf, 0).unwrap();
    assert_eq!(buf, &data[..]);
    drop(f);
    let stored = fs::read(m.backing("direct")).unwrap();
    assert_eq!(stored.len(), 3 * page);
    assert_eq!(&stored[..2 * page], &data[..]);
    assert_eq!(&stored[2 * page..], &data[..page]);
}

#[test]
fn readdir_inode_numbers_are_stat_inode_numbers() {
    let m = Mount::new();
    fs::write(m.path("a"), b"").unwrap();
    fs::hard_link(m.path("a"), m.path("a-link")).unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/inner"), b"").unwrap();
    std::os::unix::fs::symlink("a", m.path("sym")).unwrap();
    // Entries the kernel has not looked up yet, and ones it has.
    fs::write(m.backing("behind"), b"").unwrap();
    for dir in [m.mnt.clone(), m.path("d")] {
        for (name, ino) in dir_entries(&dir) {
            if name == ".." && dir == m.mnt {
                continue; // outside the mount
            }
            let st = fs::symlink_metadata(dir.join(&name)).unwrap();
            assert_eq!(ino, st.ino(), "{}/{name}", dir.display());
        }
    }
    let a = fs::metadata(m.path("a")).unwrap().ino();
    assert_eq!(fs::metadata(m.path("a-link")).unwrap().ino(), a);
}

#[test]
fn chattr_changes_ctime_as_seen_through_the_mount() {
    let m = Mount::new();
    let f = m.path("f");
    fs::write(&f, b"x").unwrap();
    let before = fs::metadata(&f).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    run_ok(Command::new("chattr").arg("+A").arg(&f));
    let through = fs::metadata(&f).unwrap();
    let direct = fs::metadata(m.backing("f")).unwrap();
    assert_ne!(
        (direct.ctime(), direct.ctime_nsec()),
        (before.ctime(), before.ctime_nsec())
    );
    assert_eq!(
        (through.ctime(), through.ctime_nsec()),
        (direct.ctime(), direct.ctime_nsec())
    );
}

// ---------------------------------------------------------------------------
// The same operations directly and through the mount
// ---------------------------------------------------------------------------

/// A record of what a sequence of operations observed, line by line.
struct Trace {
    dir: PathBuf,
    lines: Vec<String>,
}

impl Trace {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn note<T: Debug>(&mut self, what: &str, result: io::Result<T>) -> Option<T> {
        let shown = match &result {
            Ok(v) => format!("{what}: {v:?}"),
            Err(e) => format!("{what}: errno {:?}", e.raw_os_error()),
        };
        self.lines.push(shown);
        result.ok()
    }

    /// The attributes that must agree (not the inode number, device or
    /// times set by the clock).
    fn stat(&mut self, name: &str) {
        let st = fs::symlink_metadata(self.path(name)).map(|st| {
            (
                st.mode(),
                st.nlink(),
                st.uid(),
                st.gid(),
                st.size(),
                st.blocks(),
            )
        });
        self.note(&format!("stat {name}"), st);
    }

    fn read(&mut self, name: &str) {
        let data = fs::read(self.path(name));
        self.note(&format!("read {name}"), data);
    }
}

fn files_and_links(t: &mut Trace) {
    let new = |t: &Trace, name| {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o640)
            .open(t.path(name))
    };
    let f = new(t, "a");
    t.note("write a", f.and_then(|f| f.write_all_at(b"hello", 0)));
    t.note("create a again", new(t, "a").map(drop));
    t.note("write b", fs::write(t.path("b"), b"bee"));
    t.note("rename b over a", fs::rename(t.path("b"), t.path("a")));
    t.read("a");
    t.note("link a c", fs::hard_link(t.path("a"), t.path("c")));
    t.stat("a");
    t.note("link onto c", fs::hard_link(t.path("a"), t.path("c")));
    t.note("unlink c", fs::remove_file(t.path("c")));
    t.stat("a");
    // Unlinked while open: still readable and writable.
    let open = OpenOptions::new().read(true).write(true).open(t.path("a"));
    let open = open.unwrap();
    t.note("unlink a", fs::remove_file(t.path("a")));
    t.note("write unlinked", open.write_all_at(b"more", 3));
    let mut buf = [0u8; 7];
    t.note(
        "read unlinked",
        open.read_exact_at(&mut buf, 0).map(|()| buf),
    );
    t.note(
        "fstat unlinked",
        open.metadata().map(|m| (m.nlink(), m.len())),
    );
    t.stat("a");
    t.note("symlink", std::os::unix::fs::symlink("target", t.path("s")));
    t.note("readlink", fs::read_link(t.path("s")));
    t.stat("s");
    t.note(
        "mkfifo",
        rustix::fs::mknodat(
            rustix::fs::CWD,
            t.path("p"),
            rustix::fs::FileType::Fifo,
            0o600.into(),
            0,
        )
        .map_err(io::Error::from),
    );
    t.stat("p");
}

fn sizes_and_holes(t: &mut Trace) {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(t.path("sparse"));
    let f = f.unwrap();
    t.note("write far", f.write_all_at(b"data", 1 << 20));
    t.note("truncate up", f.set_len(3 << 20));
    t.note("truncate down", f.set_len((1 << 20) + 2));
    t.read("sparse");
    for from in [0u64, 1 << 20] {
        let data = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(from)).map_err(io::Error::from);
        t.note(&format!("SEEK_DATA {from}"), data);
        let hole = rustix::fs::seek(&f, rustix::fs::SeekFrom::Hole(from)).map_err(io::Error::from);
        t.note(&format!("SEEK_HOLE {from}"), hole);
    }
    let past = rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(4 << 20)).map_err(io::Error::from);
    t.note("SEEK_DATA past the end", past);
    use rustix::fs::FallocateFlags as F;
    for (name, flags, at, len) in [
        ("allocate", F::empty(), 0, 65536),
        ("keep size", F::KEEP_SIZE, 4 << 20, 65536),
        ("punch", F::PUNCH_HOLE | F::KEEP_SIZE, 0, 8192),
        ("zero", F::ZERO_RANGE, 1 << 20, 4096),
        ("punch alone", F::PUNCH_HOLE, 0, 4096),
    ] {
        let r = rustix::fs::fallocate(&f, flags, at, len).map_err(io::Error::from);
        t.note(&format!("fallocate {name}"), r);
        t.stat("sparse");
    }
    let hole = rustix::fs::seek(&f, rustix::fs::SeekFrom::Hole(0)).map_err(io::Error::from);
    t.note("SEEK_HOLE after punch", hole);
    t.read("sparse");
}

fn xattrs_and_times(t: &mut Trace) {
    fs::write(t.path("x"), b"").unwrap();
    let x = t.path("x");
    let set = |name: &str, value: &[u8], flags| {
        rustix::fs::setxattr(&x, name, value, flags).map_err(io::Error::from)
    };
    t.note("setxattr", set("user.one", b"1", XattrFlags::empty()));
    t.note(
        "setxattr create existing",
        set("user.one", b"2", XattrFlags::CREATE),
    );
    t.note(
        "setxattr replace missing",
        set("user.two", b"2", XattrFlags::REPLACE),
    );
    t.note(
        "setxattr trusted",
        set("trusted.t", b"t", XattrFlags::empty()),
    );
    t.note(
        "setxattr bogus namespace",
        set("bogus.b", b"b", XattrFlags::empty()),
    );
    t.note("getxattr", get_xattr(&x, "user.one"));
    t.note("getxattr missing", get_xattr(&x, "user.none"));
    let mut small = [0u8; 0];
    let r = rustix::fs::getxattr(&x, "user.one", &mut small[..]).map_err(io::Error::from);
    t.note("getxattr size", r);
    t.note(
        "listxattr",
        xattr_names(&x).map(|mut n| {
            n.sort();
            n
        }),
    );
    let r = rustix::fs::removexattr(&x, "user.one").map_err(io::Error::from);
    t.note("removexattr", r);
    let r = rustix::fs::removexattr(&x, "user.one").map_err(io::Error::from);
    t.note("removexattr again", r);
    for (sec, nsec) in [(0, 0), (-1, 999_999_999), (-315_619_140, 0), (1 << 33, 123)] {
        let ts = Timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        };
        let stamps = Timestamps {
            last_access: ts,
            last_modification: ts,
        };
        let r = rustix::fs::utimensat(rustix::fs::CWD, &x, &stamps, rustix::fs::AtFlags::empty());
        t.note(
            &format!("utimensat {sec}.{nsec}"),
            r.map_err(io::Error::from),
        );
        let st = fs::metadata(&x).map(|m| (m.atime(), m.atime_nsec(), m.mtime(), m.mtime_nsec()));
        t.note("times", st);
    }
}

fn directory_offsets(t: &mut Trace) {
    let d = t.path("dir");
    fs::create_dir(&d).unwrap();
    for i in 0..60 {
        fs::write(d.join(format!("e{i:02}")), b"").unwrap();
    }
    let mut dir = Dir::new(File::open(&d).unwrap()).unwrap();
    let mut seen = Vec::new();
    let mut marks = Vec::new();
    while let Some(e) = dir.read() {
        let e = e.unwrap();
        seen.push(e.file_name().to_string_lossy().into_owned());
        marks.push(e.offset());
        if seen.len() == 20 {
            // Changes while the listing is under way.
            for i in 0..10 {
                fs::remove_file(d.join(format!("e{:02}", 59 - i))).unwrap();
                fs::write(d.join(format!("n{i:02}")), b"").unwrap();
            }
        }
    }
    t.note("listing with changes", Ok::<_, io::Error>(seen.clone()));
    // Back to a remembered position: the same entries follow.
    dir.seek(marks[9]).unwrap();
    let again: Vec<String> = std::iter::from_fn(|| dir.read())
        .take(5)
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    t.note("after seekdir", Ok::<_, io::Error>(again));
    dir.rewind();
    let mut all: Vec<String> = std::iter::from_fn(|| dir.read())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    all.sort();
    t.note("after rewind", Ok::<_, io::Error>(all));
}

/// A directory larger than one readdir request, changed while it is read:
/// whatever the offsets are, every entry present throughout is listed
/// exactly once (POSIX leaves open only the entries added or removed).
fn large_directory_under_change(t: &mut Trace) {
    let d = t.path("big");
    fs::create_dir(&d).unwrap();
    for i in 0..400 {
        fs::write(d.join(format!("f{i:03}-with-a-longer-name")), b"").unwrap();
    }
    let mut dir = Dir::new(File::open(&d).unwrap()).unwrap();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut read = 0;
    while let Some(e) = dir.read() {
        *seen
            .entry(e.unwrap().file_name().to_string_lossy().into_owned())
            .or_default() += 1;
        read += 1;
        if read == 100 {
            for i in (0..400).step_by(7) {
                fs::remove_file(d.join(format!("f{i:03}-with-a-longer-name"))).unwrap();
            }
            for i in 0..50 {
                fs::write(d.join(format!("g{i:03}")), b"").unwrap();
            }
        }
    }
    let missing: Vec<String> = (0..400)
        .filter(|i| i % 7 != 0)
        .map(|i| format!("f{i:03}-with-a-longer-name"))
        .filter(|n| seen.get(n) != Some(&1))
        .collect();
    t.note("kept entries not listed once", Ok::<_, io::Error>(missing));
    let mut twice: Vec<&String> = seen
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(k, _)| k)
        .collect();
    twice.sort();
    t.note("entries listed twice", Ok::<_, io::Error>(twice));
}

/// Names: the errors of directory operations and rename's flags.
fn names_and_renames(t: &mut Trace) {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    let dir = t.dir.clone();
    let rename = |a: &str, b: &str, flags| {
        renameat_with(CWD, dir.join(a), CWD, dir.join(b), flags).map_err(io::Error::from)
    };
    fs::create_dir(t.path("d1")).unwrap();
    fs::create_dir(t.path("d2")).unwrap();
    fs::write(t.path("d2/inside"), b"").unwrap();
    fs::write(t.path("n1"), b"one").unwrap();
    fs::write(t.path("n2"), b"two").unwrap();
    t.note(
        "rename n1 n2 NOREPLACE",
        rename("n1", "n2", RenameFlags::NOREPLACE),
    );
    t.note(
        "rename n1 n2 EXCHANGE",
        rename("n1", "n2", RenameFlags::EXCHANGE),
    );
    t.read("n1");
    t.note(
        "rename d1 d2 empty",
        rename("d1", "d2", RenameFlags::empty()),
    );
    t.note(
        "rename n1 d1 empty",
        rename("n1", "d1", RenameFlags::empty()),
    );
    t.note(
        "rename d1 n1 empty",
        rename("d1", "n1", RenameFlags::empty()),
    );
    t.note(
        "rename d1 d1/sub empty",
        rename("d1", "d1/sub", RenameFlags::empty()),
    );
    t.note("mkdir existing", fs::create_dir(t.path("d1")));
    t.note("rmdir non-empty", fs::remove_dir(t.path("d2")));
    t.note("unlink a directory", fs::remove_file(t.path("d1")));
    t.note("rmdir a file", fs::remove_dir(t.path("n1")));
    t.note(
        "open a file as a directory",
        File::open(t.path("n1/x")).map(drop),
    );
    let append = OpenOptions::new().append(true).open(t.path("n1"));
    t.note(
        "append",
        append.and_then(|mut f| io::Write::write_all(&mut f, b"+")),
    );
    t.read("n1");
    t.note(
        "rename dir over empty dir",
        fs::rename(t.path("d2"), t.path("d1")),
    );
    t.stat("d1");
    t.note(
        "listing",
        fs::read_dir(t.path("d1")).map(|it| it.map(|e| e.unwrap().file_name()).collect::<Vec<_>>()),
    );
}

/// Changes of mode and owner as root, then what `nobody` may and may not do
/// (run as that user by a small Python program).
fn owners_and_modes(t: &mut Trace) {
    fs::write(t.path("own"), b"").unwrap();
    fs::write(t.path("root-file"), b"").unwrap();
    let own = t.path("own");
    t.note(
        "chmod 4755",
        fs::set_permissions(&own, fs::Permissions::from_mode(0o4755)),
    );
    let r = std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY));
    t.note("chown nobody", r);
    t.stat("own");
    t.note(
        "chmod 2775",
        fs::set_permissions(&own, fs::Permissions::from_mode(0o2775)),
    );
    t.stat("own");
    let script = "\
import os, sys
d = sys.argv[1]
def do(what, f):
    try:
        f()
        print(what, 'ok')
    except OSError as e:
        print(what, 'errno', e.errno)
own, other = os.path.join(d, 'own'), os.path.join(d, 'root-file')
do('chmod own', lambda: os.chmod(own, 0o6711))
do('stat own', lambda: print(oct(os.stat(own).st_mode)))
do('chown own to root', lambda: os.chown(own, 0, 0))
do('chown own to own group', lambda: os.chown(own, -1, 65534))
do('chmod other', lambda: os.chmod(other, 0o777))
do('utime other now', lambda: os.utime(other))
do('utime other set', lambda: os.utime(other, (1, 1)))
do('utime own set', lambda: os.utime(own, (5, 5)))
do('write other', lambda: open(other, 'w'))
do('create in dir', lambda: open(os.path.join(d, 'by-nobody'), 'w'))
do('unlink other', lambda: os.unlink(other))
do('setxattr other', lambda: os.setxattr(other, 'user.n', b'1'))
do('setxattr own', lambda: os.setxattr(own, 'user.n', b'1'))
";
    let out = run(Command::new("python3")
        .args(["-c", script])
        .arg(&t.dir)
        .uid(NOBODY)
        .gid(NOBODY));
    t.lines
        .push(String::from_utf8_lossy(&out.stdout).into_owned());
    t.lines
        .push(String::from_utf8_lossy(&out.stderr).into_owned());
    t.stat("own");
    t.stat("root-file");
    t.stat("by-nobody");
}

/// Runs every sequence in `dir`.
fn trace(dir: &Path) -> Vec<String> {
    fs::create_dir(dir).unwrap();
    // Writable by everyone, as `nobody` creates a file in it.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
    let mut t = Trace {
        dir: dir.to_owned(),
        lines: Vec::new(),
    };
    files_and_links(&mut t);
    sizes_and_holes(&mut t);
    xattrs_and_times(&mut t);
    directory_offsets(&mut t);
    large_directory_under_change(&mut t);
    names_and_renames(&mut t);
    owners_and_modes(&mut t);
    t.lines
}

#[test]
fn generic_operations_behave_as_on_the_backing_filesystem() {
    let m = Mount::with_args(&["-o", "allow_other"]);
    let direct = trace(&m.backing("direct"));
    let through = trace(&m.path("through"));
    let differences: Vec<String> = direct
        .iter()
        .zip(&through)
        .filter(|(d, t)| d != t)
        .map(|(d, t)| format!("  direct:  {d}\n  through: {t}"))
        .collect();
    assert!(
        differences.is_empty() && direct.len() == through.len(),
        "{} differences:\n{}",
        differences.len(),
        differences.join("\n")
    );
}
