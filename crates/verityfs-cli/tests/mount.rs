//! Integration tests of `verityfs mount`: real FUSE mounts, driven by the
//! unmodified `fsverity` program (fsverity-utils v1.5), coreutils and raw
//! ioctls, against the kernel's fs-verity behaviour (enable's errnos in the
//! order of `fsverity_ioctl_enable()` in Linux's `fs/verity/enable.c`, the
//! rules after enable, interruption, corruption, as
//! `Documentation/filesystems/fsverity.rst` and xfstests' generic/572, 573
//! and 574 describe them) plus plain passthrough behaviour.
//!
//! Every test mounts a fresh temporary backing directory of its own (the
//! [`Mount`] guard), so tests are independent and run in parallel; the
//! guard always unmounts and reaps the daemon, even when a test fails.
//! The tests need root (for `drop_caches`, `chattr +i`, other users via
//! `setpriv`), `/dev/fuse`, `/usr/bin/fsverity`, e2fsprogs' `chattr` and
//! `lsattr`, util-linux's `setpriv` and `python3`; without them they fail
//! rather than skip.

mod common;

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::Signal;

use common::*;

// ---------------------------------------------------------------------------
// Helpers of this suite (the shared ones are in `common`)
// ---------------------------------------------------------------------------

/// The size of the sparse files whose enable takes long enough to be
/// caught running (as in xfstests' generic/572).
const HUGE: u64 = 16 << 30;
/// Where the Merkle tree starts past the data (the layout's alignment).
const TREE_ALIGNMENT: u64 = 65536;
/// The layout's extended attributes all start with this.
const PRIVATE_XATTR_PREFIX: &str = "user.verityfs";
/// The extended attribute present while an enable runs.
const ENABLING_XATTR: &str = "user.verityfs.enabling";

/// `truncate(2)` of `path` (by a small Python program: neither std nor
/// rustix has it).
fn truncate(path: &Path, size: u64) -> io::Result<()> {
    let out = run(Command::new("python3")
        .args([
            "-c",
            "import os, sys\n\
             try:\n\
             \x20   os.truncate(sys.argv[1], int(sys.argv[2]))\n\
             except OSError as e:\n\
             \x20   sys.exit(e.errno)\n",
        ])
        .arg(path)
        .arg(size.to_string()));
    match out.status.code() {
        Some(0) => Ok(()),
        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
        None => panic!("python3 truncate: {out:?}"),
    }
}

/// The flags `lsattr` shows for `path` (`-d`: directories themselves).
fn lsattr(path: &Path) -> String {
    let out = run_ok(Command::new("lsattr").arg("-d").arg(path));
    out.split_whitespace().next().unwrap_or_default().to_owned()
}

/// `chattr ARG PATH`, which must succeed.
fn chattr(arg: &str, path: &Path) {
    run_ok(Command::new("chattr").arg(arg).arg(path));
}

/// Asserts that the backing file `path` carries none of the layout's
/// private attributes.
#[track_caller]
fn assert_no_private_xattrs(path: &Path) {
    let names = xattr_names(path).unwrap();
    assert!(
        !names.iter().any(|n| n.starts_with(PRIVATE_XATTR_PREFIX)),
        "{} still has {names:?}",
        path.display()
    );
}

/// Starts `fsverity enable` on a sparse file of [`HUGE`] bytes in `m`, and
/// waits until the daemon is building its tree (the backing file has the
/// enabling record).
fn start_huge_enable(m: &Mount, name: &str) -> Spawned {
    File::create(m.path(name)).unwrap().set_len(HUGE).unwrap();
    let enabling = Spawned::new(
        Command::new(FSVERITY)
            .arg("enable")
            .arg(m.path(name))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while get_xattr(&m.backing(name), ENABLING_XATTR).is_err() {
        assert!(Instant::now() < deadline, "the enable never started");
        thread::sleep(Duration::from_millis(5));
    }
    enabling
}

// ---------------------------------------------------------------------------
// 1. Ordinary files behave like the backing filesystem
// ---------------------------------------------------------------------------

#[test]
fn ordinary_file_io_passes_through() {
    let m = Mount::new();
    let f = m.path("file");
    fs::write(&f, b"hello").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"hello");
    assert_eq!(fs::read(m.backing("file")).unwrap(), b"hello");

    let mut append = OpenOptions::new().append(true).open(&f).unwrap();
    append.write_all(b", world").unwrap();
    append.sync_all().unwrap();
    append.sync_data().unwrap();
    drop(append);
    assert_eq!(fs::read(&f).unwrap(), b"hello, world");

    let rw = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    rw.write_all_at(b"J", 7).unwrap();
    let mut buf = [0u8; 5];
    rw.read_exact_at(&mut buf, 7).unwrap();
    assert_eq!(&buf, b"Jorld");
    rw.set_len(5).unwrap();
    rw.sync_all().unwrap();
    drop(rw);
    assert_eq!(fs::read(&f).unwrap(), b"hello");
    assert_eq!(fs::metadata(m.backing("file")).unwrap().len(), 5);

    // Truncation by path, growing with a hole, and O_TRUNC.
    run_ok(Command::new("truncate").args(["-s", "100000"]).arg(&f));
    let data = fs::read(&f).unwrap();
    assert_eq!(data.len(), 100_000);
    assert!(data[5..].iter().all(|&b| b == 0));
    let big = random_bytes(3 << 20, 1);
    fs::write(&f, &big).unwrap();
    assert_eq!(fs::read(&f).unwrap(), big);
    assert_eq!(fs::read(m.backing("file")).unwrap(), big);
    fs::write(&f, b"short").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"short");

    // Exclusive creation.
    assert_errno(
        OpenOptions::new().write(true).create_new(true).open(&f),
        libc::EEXIST,
        "O_EXCL on an existing file",
    );
}

#[test]
fn names_and_directories_pass_through() {
    let m = Mount::new();
    fs::write(m.path("a"), b"A").unwrap();

    fs::rename(m.path("a"), m.path("b")).unwrap();
    assert!(!m.backing("a").exists());
    assert_eq!(fs::read(m.backing("b")).unwrap(), b"A");

    fs::hard_link(m.path("b"), m.path("c")).unwrap();
    assert_eq!(fs::metadata(m.path("b")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(m.backing("c")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(m.path("b")).unwrap().ino(),
        fs::metadata(m.path("c")).unwrap().ino()
    );
    fs::remove_file(m.path("c")).unwrap();
    assert!(!m.backing("c").exists());
    assert_eq!(fs::metadata(m.path("b")).unwrap().nlink(), 1);

    fs::create_dir(m.path("dir")).unwrap();
    assert!(m.backing("dir").is_dir());
    fs::write(m.path("dir/inner"), b"I").unwrap();
    fs::rename(m.path("b"), m.path("dir/b")).unwrap();
    assert_errno(
        fs::remove_dir(m.path("dir")),
        libc::ENOTEMPTY,
        "rmdir of a full directory",
    );
    std::os::unix::fs::symlink("dir/inner", m.path("link")).unwrap();
    assert_eq!(
        fs::read_link(m.path("link")).unwrap(),
        PathBuf::from("dir/inner")
    );
    assert_eq!(
        fs::read_link(m.backing("link")).unwrap(),
        PathBuf::from("dir/inner")
    );
    assert!(fs::symlink_metadata(m.path("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(m.path("link")).unwrap(), b"I");

    let names = |dir: &Path| {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&m.mnt), ["dir", "link"]);
    assert_eq!(names(&m.path("dir")), ["b", "inner"]);
    assert_eq!(names(&m.path("dir")), names(&m.backing("dir")));
    let ls = run_ok(Command::new("ls").arg("-a").arg(m.path("dir")));
    assert_eq!(
        ls.split_whitespace().collect::<Vec<_>>(),
        [".", "..", "b", "inner"]
    );

    fs::remove_file(m.path("link")).unwrap();
    fs::remove_file(m.path("dir/inner")).unwrap();
    fs::remove_file(m.path("dir/b")).unwrap();
    fs::remove_dir(m.path("dir")).unwrap();
    assert!(!m.backing("dir").exists());
    assert!(names(&m.mnt).is_empty());
}

#[test]
fn metadata_changes_pass_through() {
    let m = Mount::new();
    let f = m.path("f");
    fs::write(&f, b"data").unwrap();

    fs::set_permissions(&f, Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o640);
    assert_eq!(fs::metadata(m.backing("f")).unwrap().mode() & 0o7777, 0o640);

    std::os::unix::fs::chown(&f, Some(NOBODY), Some(NOBODY)).unwrap();
    for p in [&f, &m.backing("f")] {
        let md = fs::metadata(p).unwrap();
        assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY), "{}", p.display());
    }

    run_ok(
        Command::new("touch")
            .args(["-d", "2001-02-03 04:05:06.5 UTC"])
            .arg(&f),
    );
    for p in [&f, &m.backing("f")] {
        let md = fs::metadata(p).unwrap();
        assert_eq!(
            (md.mtime(), md.mtime_nsec(), md.atime(), md.atime_nsec()),
            (981_173_106, 500_000_000, 981_173_106, 500_000_000),
            "{}",
            p.display()
        );
    }
    run_ok(
        Command::new("touch")
            .args(["-m", "-d", "@1000000000"])
            .arg(&f),
    );
    assert_eq!(fs::metadata(&f).unwrap().mtime(), 1_000_000_000);
    assert_eq!(fs::metadata(&f).unwrap().atime(), 981_173_106);

    let ours = rustix::fs::statvfs(&m.mnt).unwrap();
    let theirs = rustix::fs::statvfs(&m.backing).unwrap();
    assert_eq!(
        (ours.f_blocks * ours.f_frsize, ours.f_files, ours.f_namemax),
        (
            theirs.f_blocks * theirs.f_frsize,
            theirs.f_files,
            theirs.f_namemax
        )
    );
    let df = run_ok(Command::new("df").args(["-k", "--output=size"]).arg(&m.mnt));
    let df_backing = run_ok(
        Command::new("df")
            .args(["-k", "--output=size"])
            .arg(&m.backing),
    );
    assert_eq!(df, df_backing);
}

#[test]
fn user_xattrs_pass_through_and_private_ones_are_hidden() {
    use rustix::fs::XattrFlags;
    let m = Mount::new();
    let f = m.path("f");
    fs::write(&f, b"data").unwrap();

    rustix::fs::setxattr(&f, "user.one", b"1", XattrFlags::empty()).unwrap();
    rustix::fs::setxattr(&f, "user.two", b"second", XattrFlags::CREATE).unwrap();
    assert_errno(
        rustix::fs::setxattr(&f, "user.two", b"x", XattrFlags::CREATE).map_err(io::Error::from),
        libc::EEXIST,
        "XATTR_CREATE of an existing attribute",
    );
    assert_eq!(get_xattr(&f, "user.two").unwrap(), b"second");
    assert_eq!(get_xattr(&m.backing("f"), "user.one").unwrap(), b"1");
    let mut names = xattr_names(&f).unwrap();
    names.sort();
    assert_eq!(names, ["user.one", "user.two"]);
    rustix::fs::removexattr(&f, "user.one").unwrap();
    assert_errno(get_xattr(&f, "user.one"), libc::ENODATA, "removed xattr");
    assert_errno(
        get_xattr(&m.backing("f"), "user.one"),
        libc::ENODATA,
        "removed xattr in the backing file",
    );
    // Directories too.
    fs::create_dir(m.path("d")).unwrap();
    rustix::fs::setxattr(m.path("d"), "user.dir", b"D", XattrFlags::empty()).unwrap();
    assert_eq!(get_xattr(&m.path("d"), "user.dir").unwrap(), b"D");

    // The layout's attributes of a verity file: invisible, untouchable.
    let data = verity_file(&m, "v", 10_000);
    rustix::fs::setxattr(m.path("v"), "user.mine", b"m", XattrFlags::empty()).unwrap();
    let backing_names = xattr_names(&m.backing("v")).unwrap();
    assert!(
        backing_names.iter().any(|n| n == "user.verityfs"),
        "{backing_names:?}"
    );
    assert_eq!(xattr_names(&m.path("v")).unwrap(), ["user.mine"]);
    let record = get_xattr(&m.backing("v"), "user.verityfs").unwrap();
    let digest_before = measure(&m.path("v"));
    for name in ["user.verityfs", "user.verityfs.enabling", "user.verityfsx"] {
        assert!(get_xattr(&m.path("v"), name).is_err(), "getxattr {name}");
        assert!(
            rustix::fs::setxattr(m.path("v"), name, b"junk", XattrFlags::empty()).is_err(),
            "setxattr {name} through the mount succeeded"
        );
        assert!(
            rustix::fs::removexattr(m.path("v"), name).is_err(),
            "removexattr {name} through the mount succeeded"
        );
    }
    assert_eq!(get_xattr(&m.backing("v"), "user.verityfs").unwrap(), record);
    assert_eq!(
        xattr_names(&m.backing("v")).unwrap().len(),
        backing_names.len()
    );
    assert_eq!(measure(&m.path("v")), digest_before);
    assert_eq!(fs::read(m.path("v")).unwrap(), data);
}

#[test]
fn chattr_append_only_and_immutable_reach_the_backing_file() {
    let m = Mount::new();
    let f = m.path("f");
    fs::write(&f, b"start").unwrap();

    chattr("+a", &f);
    assert!(lsattr(&f).contains('a'), "{}", lsattr(&f));
    assert!(lsattr(&m.backing("f")).contains('a'));
    let mut append = OpenOptions::new().append(true).open(&f).unwrap();
    append.write_all(b"+more").unwrap();
    drop(append);
    assert_eq!(fs::read(&f).unwrap(), b"start+more");
    assert_errno(
        OpenOptions::new().write(true).open(&f),
        libc::EPERM,
        "open for overwrite of an append-only file",
    );
    assert_errno(
        fs::remove_file(&f),
        libc::EPERM,
        "unlink of an append-only file",
    );
    chattr("-a", &f);
    assert!(!lsattr(&f).contains('a'));
    assert!(!lsattr(&m.backing("f")).contains('a'));

    chattr("+i", &f);
    assert!(lsattr(&f).contains('i'), "{}", lsattr(&f));
    assert!(lsattr(&m.backing("f")).contains('i'));
    assert_errno(
        OpenOptions::new().append(true).open(&f),
        libc::EPERM,
        "open for append of an immutable file",
    );
    assert_errno(
        fs::rename(&f, m.path("g")),
        libc::EPERM,
        "rename of an immutable file",
    );
    chattr("-i", &f);
    assert!(!lsattr(&m.backing("f")).contains('i'));
    fs::write(&f, b"writable again").unwrap();

    // The struct fsxattr interface (xfs_io's chattr): read the flags, add
    // FS_XFLAG_NODUMP, read them back.
    let out = run_ok(
        Command::new("python3")
            .arg("-c")
            .arg(
                "import fcntl, struct, sys\n\
         f = open(sys.argv[1], 'rb')\n\
         x = list(struct.unpack('<5I8x', fcntl.ioctl(f, 0x801c581f, bytes(28))))\n\
         x[0] |= 0x80\n\
         fcntl.ioctl(f, 0x401c5820, struct.pack('<5I8x', *x))\n\
         print(struct.unpack('<5I8x', fcntl.ioctl(f, 0x801c581f, bytes(28)))[0])\n",
            )
            .arg(&f),
    );
    assert_eq!(out, "128\n", "fsx_xflags after FS_IOC_FSSETXATTR");
    assert!(
        lsattr(&m.backing("f")).contains('d'),
        "{}",
        lsattr(&m.backing("f"))
    );
}

// ---------------------------------------------------------------------------
// 2. Enable and measure with fsverity
// ---------------------------------------------------------------------------

#[test]
fn enable_and_measure_match_fsverity_digest() {
    const PARAMS: &[&[&str]] = &[
        &[],
        &["--hash-alg=sha512"],
        &["--block-size=1024"],
        &["--block-size=65536"],
        &["--salt=f3c93fa6fb828c0e1587e5714ecf6f56"],
    ];
    const SIZES: &[usize] = &[0, 1, 4096, 100_000, (3 << 20) + 12345];
    let mut m = Mount::new();
    let mut files = Vec::new();
    for (p, params) in PARAMS.iter().enumerate() {
        for &size in SIZES {
            let name = format!("f{p}-{size}");
            let data = random_bytes(size, (p * 1000 + size) as u64);
            let path = write_file(&m, &name, &data);
            let expected = digest(&m.scratch(&name), params);
            enable(&path, params);
            files.push((name, params, data, expected));
        }
    }
    let check = |m: &Mount, when: &str| {
        for (name, params, data, expected) in &files {
            let path = m.path(name);
            let what = format!("{name} {params:?} {when}");
            assert_eq!(&measure(&path), expected, "{what}");
            assert_eq!(&raw_measure(&path, 64).unwrap(), expected, "{what}");
            assert_eq!(
                fs::metadata(&path).unwrap().len(),
                data.len() as u64,
                "{what}"
            );
            assert!(
                fs::read(&path).unwrap() == *data,
                "{what}: contents changed"
            );
            assert!(
                lsattr(&path).contains('V'),
                "{what}: lsattr {}",
                lsattr(&path)
            );
            // The data stays at the start of the backing file.
            let backing = fs::read(m.backing(name)).unwrap();
            assert!(backing.starts_with(data), "{what}: backing data changed");
        }
    };
    check(&m, "after enable");
    m.remount(&[]);
    check(&m, "after remount");
    // Not verity: no V.
    fs::write(m.path("plain"), b"x").unwrap();
    assert!(!lsattr(&m.path("plain")).contains('V'));
}

/// The pages of `path` in the page cache, as util-linux's `fincore`
/// counts them.
fn cached_pages(path: &Path) -> u64 {
    let out = run_ok(
        Command::new("fincore")
            .args(["--noheadings", "--output=PAGES"])
            .arg(path),
    );
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("fincore said {out:?}"))
}

/// Drops the pages of `path` from the page cache (written back first).
fn evict(path: &Path) {
    File::open(path).unwrap().sync_all().unwrap();
    let nocache = format!("if={}", path.display());
    run_ok(Command::new("dd").args([nocache.as_str(), "iflag=nocache", "count=0"]));
    assert_eq!(cached_pages(path), 0, "{} still cached", path.display());
}

#[test]
fn listing_verity_files_reads_none_of_them() {
    let mut m = Mount::new();
    let data = random_bytes(16384, 12);
    for name in ["small", "other"] {
        write_file(&m, name, &data);
        enable(&m.path(name), &[]);
    }
    m.remount(&[]);
    evict(&m.backing("small"));
    // What `ls -l` and `find -size` do; the kernel reads a verity file's
    // descriptor at its first open, not to stat it.
    let listed = fs::read_dir(m.path("")).unwrap();
    for entry in listed {
        let entry = entry.unwrap();
        assert_eq!(entry.metadata().unwrap().len(), 16384, "{entry:?}");
    }
    assert_eq!(fs::metadata(m.path("small")).unwrap().len(), 16384);
    assert_eq!(cached_pages(&m.backing("small")), 0, "stat read the file");
    // Opening it reads it (what shows that the count above can see reads).
    assert!(fs::read(m.path("small")).unwrap() == data);
    assert!(cached_pages(&m.backing("small")) > 0);
    assert!(lsattr(&m.path("other")).contains('V'));
}

// ---------------------------------------------------------------------------
// 3. Enable's errors, in the kernel's order, and the rules after enable
// ---------------------------------------------------------------------------

#[test]
fn enable_rejects_bad_arguments() {
    let m = Mount::new();
    let data = random_bytes(100_000, 7);
    let f = write_file(&m, "f", &data);
    let bad = |change: &dyn Fn(&mut EnableArg), errno: i32, what: &str| {
        let mut arg = EnableArg::default();
        change(&mut arg);
        assert_errno(raw_enable(&f, &arg), errno, what);
    };
    let (einval, emsgsize) = (libc::EINVAL, libc::EMSGSIZE);
    bad(&|a| a.version = 0, einval, "version 0");
    bad(&|a| a.version = 2, einval, "version 2");
    bad(&|a| a.reserved1 = 1, einval, "__reserved1");
    bad(&|a| a.reserved2[0] = 1, einval, "__reserved2[0]");
    bad(&|a| a.reserved2[10] = 1 << 63, einval, "__reserved2[10]");
    for bs in [0, 3, 4095, 4097, 0x8000_0001] {
        bad(&|a| a.block_size = bs, einval, &format!("block size {bs}"));
    }
    for bs in [1, 2, 512, 1 << 17, 1 << 31] {
        bad(
            &|a| a.block_size = bs,
            einval,
            &format!("unsupported block size {bs}"),
        );
    }
    bad(&|a| a.salt = vec![0xa5; 33], emsgsize, "33-byte salt");
    bad(&|a| a.salt = vec![0xa5; 500], emsgsize, "500-byte salt");
    bad(
        &|a| a.sig = vec![1; MAX_SIGNATURE_SIZE + 1],
        emsgsize,
        "16129-byte signature",
    );
    for alg in [0, 3, 257, u32::MAX] {
        bad(
            &|a| a.hash_algorithm = alg,
            einval,
            &format!("hash algorithm {alg}"),
        );
    }
    // The kernel's order: version before sizes, sizes before the algorithm.
    bad(
        &|a| {
            a.version = 2;
            a.salt = vec![0; 33];
        },
        einval,
        "version 2 and a 33-byte salt",
    );
    bad(
        &|a| {
            a.hash_algorithm = 257;
            a.salt = vec![0; 33];
        },
        emsgsize,
        "hash algorithm 257 and a 33-byte salt",
    );
    bad(
        &|a| {
            a.block_size = 3;
            a.sig = vec![0; MAX_SIGNATURE_SIZE + 1];
        },
        einval,
        "block size 3 and a big signature",
    );

    // The same through fsverity (generic/572's cases).
    assert_enable_fails(&f, &[&format!("--salt={}", "A".repeat(1000))], emsgsize);
    assert_enable_fails(&f, &["--hash-alg=257"], einval);
    assert_enable_fails(&f, &["--block-size=1"], einval);
    assert_enable_fails(&f, &["--block-size=131072"], einval);

    // Nothing happened to the file.
    assert_errno(
        raw_measure(&f, 64),
        libc::ENODATA,
        "measure after failed enables",
    );
    assert_eq!(fs::read(&f).unwrap(), data);
    assert_eq!(
        fs::metadata(m.backing("f")).unwrap().len(),
        data.len() as u64
    );
    assert_no_private_xattrs(&m.backing("f"));

    // A 32-byte salt is fine, and the raw enable is measured like fsverity's.
    let salt = random_bytes(32, 9);
    raw_enable(
        &f,
        &EnableArg {
            hash_algorithm: 2,
            block_size: 1024,
            salt: salt.clone(),
            ..EnableArg::default()
        },
    )
    .unwrap();
    let hex: String = salt.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        measure(&f),
        digest(
            &m.scratch("f"),
            &[
                "--hash-alg=sha512",
                "--block-size=1024",
                &format!("--salt={hex}")
            ]
        )
    );
}

/// Gives `path` (mode 0666) an access ACL that denies `nobody` everything.
fn deny_nobody(path: &Path) {
    let entry = |tag: u16, perm: u16, id: u32| {
        [
            &tag.to_le_bytes()[..],
            &perm.to_le_bytes(),
            &id.to_le_bytes(),
        ]
        .concat()
    };
    let (rw, anyone) = (6, u32::MAX);
    let acl = [
        2u32.to_le_bytes().to_vec(), // the format's version
        entry(0x01, rw, anyone),     // the owner
        entry(0x02, 0, NOBODY),      // nobody
        entry(0x04, rw, anyone),     // the group
        entry(0x10, rw, anyone),     // the mask
        entry(0x20, rw, anyone),     // others
    ]
    .concat();
    let flags = rustix::fs::XattrFlags::empty();
    rustix::fs::setxattr(path, "system.posix_acl_access", &acl, flags)
        .expect("setting an ACL (the test directory's filesystem must support them)");
}

/// The errno `nobody` gets opening `path` with `flags`, 0 if it opens.
fn nobody_opens(path: &Path, flags: i32) -> i32 {
    let script = "import os, sys\n\
                  try: os.open(sys.argv[1], int(sys.argv[2])); print(0)\n\
                  except OSError as e: print(e.errno)\n";
    let out = run_ok(
        as_nobody("/usr/bin/python3")
            .args(["-c", script])
            .arg(path)
            .arg(flags.to_string()),
    );
    out.trim().parse().unwrap()
}

/// A user whom an ACL denies, in the backing store, gets `EACCES` at open
/// (the kernel, which sees only the mode bits, lets the open through),
/// whatever the file: the kernel checks permission before fs-verity's
/// rules (`EPERM` for writing a verity file).
#[test]
fn a_user_denied_by_an_acl_gets_eacces_before_verity_rules() {
    let m = Mount::with_args(&["-o", "allow_other"]);
    for name in ["plain", "verity"] {
        write_file(&m, name, &random_bytes(5000, 5));
    }
    enable(&m.path("verity"), &[]);
    for name in ["plain", "verity"] {
        fs::set_permissions(m.backing(name), Permissions::from_mode(0o666)).unwrap();
        deny_nobody(&m.backing(name));
        for flags in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
            let errno = nobody_opens(&m.path(name), flags);
            assert_eq!(errno, libc::EACCES, "{name} opened with flags {flags}");
        }
    }
}

#[test]
fn enable_checks_permissions_and_file_types() {
    let m = Mount::with_args(&["-o", "allow_other"]);
    // No write permission for a non-root caller: EACCES (generic/573).
    let ro = write_file(&m, "ro", &random_bytes(5000, 1));
    fs::set_permissions(&ro, Permissions::from_mode(0o444)).unwrap();
    assert_fsverity_fails(
        as_nobody(FSVERITY).arg("enable").arg(&ro),
        "FS_IOC_ENABLE_VERITY",
        &ro,
        libc::EACCES,
    );
    assert_errno(raw_measure(&ro, 64), libc::ENODATA, "after EACCES");

    // ...but with write permission a non-root caller may enable (573), and
    // anyone may measure a 0444 verity file.
    let mine = write_file(&m, "mine", &random_bytes(5000, 2));
    std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();
    run_ok(as_nobody(FSVERITY).arg("enable").arg(&mine));
    let expected = digest(&m.scratch("mine"), &[]);
    assert_eq!(measure(&mine), expected);
    enable(&ro, &[]);
    let measured = measure_with(as_nobody(FSVERITY).arg("measure").arg(&ro), &ro);
    assert_eq!(measured, digest(&m.scratch("ro"), &[]));

    // An fd opened for ioctls only (access mode 3): EBADF.
    let f = write_file(&m, "f", &random_bytes(5000, 3));
    let ioctl_only = rustix::fs::open(
        &f,
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map(File::from)
    .unwrap();
    assert_errno(
        verity_ioctl(&ioctl_only, VerityIoctl::Enable(&EnableArg::default())),
        libc::EBADF,
        "enable on an access-mode-3 fd",
    );
    drop(ioctl_only);

    // Append-only and immutable: EPERM (573).
    chattr("+a", &f);
    assert_enable_fails(&f, &[], libc::EPERM);
    chattr("-a", &f);
    chattr("+i", &f);
    assert_enable_fails(&f, &[], libc::EPERM);
    chattr("-i", &f);
    assert_errno(raw_measure(&f, 64), libc::ENODATA, "after EPERM");
    assert_no_private_xattrs(&m.backing("f"));

    // A directory: EISDIR (572).
    fs::create_dir(m.path("dir")).unwrap();
    assert_enable_fails(&m.path("dir"), &[], libc::EISDIR);

    // The kernel's order (inode_permission(), then the rest): immutable
    // before the mode bits, the mode bits before append-only, append-only
    // before the file type.
    let nobody_enable = |path: &Path, errno: i32| {
        assert_fsverity_fails(
            as_nobody(FSVERITY).arg("enable").arg(path),
            "FS_IOC_ENABLE_VERITY",
            path,
            errno,
        )
    };
    let other = write_file(&m, "other", &random_bytes(5000, 4));
    fs::set_permissions(&other, Permissions::from_mode(0o444)).unwrap();
    chattr("+i", &other);
    nobody_enable(&other, libc::EPERM);
    chattr("-i", &other);
    chattr("+a", &other);
    nobody_enable(&other, libc::EACCES);
    chattr("-a", &other);
    chattr("+a", &m.path("dir"));
    assert_enable_fails(&m.path("dir"), &[], libc::EPERM);
    chattr("-a", &m.path("dir"));

    // Still possible once the obstacles are gone.
    enable(&f, &[]);
    assert_eq!(measure(&f), digest(&m.scratch("f"), &[]));
}

#[test]
fn enable_on_a_read_only_mount_is_erofs() {
    let mut m = Mount::new();
    let f = write_file(&m, "f", &random_bytes(5000, 1));
    let data = verity_file(&m, "v", 70_000);
    let expected = measure(&m.path("v"));
    m.remount(&["-o", "ro"]);
    assert_enable_fails(&f, &[], libc::EROFS);
    // EROFS comes first (inode_permission()), even for a directory.
    assert_enable_fails(&m.mnt, &[], libc::EROFS);
    assert_errno(
        OpenOptions::new().write(true).open(&f),
        libc::EROFS,
        "open for writing on a read-only mount",
    );
    // Verity files still verify and measure.
    assert_eq!(measure(&m.path("v")), expected);
    assert_eq!(fs::read(m.path("v")).unwrap(), data);
    assert_errno(
        raw_measure(&f, 64),
        libc::ENODATA,
        "measure of a plain file",
    );
    m.remount(&["--read-only"]);
    assert_enable_fails(&f, &[], libc::EROFS);
}

#[test]
fn enable_refuses_files_open_for_writing() {
    let m = Mount::new();
    let f = write_file(&m, "f", &random_bytes(100_000, 1));

    // The caller's own O_RDWR fd (`exec 3<>`): ETXTBSY, on that fd and on
    // a read-only one.
    let rw = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    assert_errno(
        verity_ioctl(&rw, VerityIoctl::Enable(&EnableArg::default())),
        libc::ETXTBSY,
        "enable on an O_RDWR fd",
    );
    assert_errno(
        raw_enable(&f, &EnableArg::default()),
        libc::ETXTBSY,
        "enable while an O_RDWR fd is open",
    );
    assert_enable_fails(&f, &[], libc::ETXTBSY);
    drop(rw);
    let wo = OpenOptions::new().append(true).open(&f).unwrap();
    assert_enable_fails(&f, &[], libc::ETXTBSY);
    drop(wo);

    // A writable shared mapping whose fd is closed still counts.
    let mut mapper = Spawned::new(
        Command::new("python3")
            .args([
                "-c",
                "import mmap, sys\n\
                 f = open(sys.argv[1], 'r+b')\n\
                 m = mmap.mmap(f.fileno(), 0)\n\
                 f.close()\n\
                 print('mapped', flush=True)\n\
                 sys.stdin.readline()\n",
            ])
            .arg(&f)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let mut line = String::new();
    BufReader::new(mapper.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "mapped\n");
    assert_enable_fails(&f, &[], libc::ETXTBSY);
    drop(mapper.0.stdin.take());
    let status = wait_for(&mut mapper.0, EXIT_TIMEOUT).expect("python exits");
    assert!(status.success());

    // No writers left: the enable works; a second gives EEXIST, but an
    // invalid algorithm is still EINVAL (checked first).
    enable(&f, &[]);
    assert_enable_fails(&f, &[], libc::EEXIST);
    assert_enable_fails(&f, &["--hash-alg=sha512"], libc::EEXIST);
    assert_enable_fails(&f, &["--hash-alg=257"], libc::EINVAL);
    assert_eq!(measure(&f), digest(&m.scratch("f"), &[]));
}

#[test]
fn enable_is_exclusive_while_running() {
    let m = Mount::new();
    let enabling = start_huge_enable(&m, "big");
    let big = m.path("big");
    // A second enable: EBUSY (572).
    assert_enable_fails(&big, &[], libc::EBUSY);
    // Writers: ETXTBSY, truncation too.
    assert_errno(
        OpenOptions::new().write(true).open(&big),
        libc::ETXTBSY,
        "open for writing during an enable",
    );
    assert_errno(
        OpenOptions::new().read(true).write(true).open(&big),
        libc::ETXTBSY,
        "open O_RDWR during an enable",
    );
    assert_errno(
        truncate(&big, 1),
        libc::ETXTBSY,
        "truncate(2) during an enable",
    );
    // Readers see the data; measure says not verity yet (579).
    assert_errno(
        raw_measure(&big, 64),
        libc::ENODATA,
        "measure during an enable",
    );
    assert_eq!(fs::metadata(&big).unwrap().len(), HUGE);
    let mut head = vec![1u8; 1 << 20];
    File::open(&big).unwrap().read_exact(&mut head).unwrap();
    assert!(head.iter().all(|&b| b == 0));
    assert!(
        get_xattr(&m.backing("big"), ENABLING_XATTR).is_ok(),
        "the first enable finished too early for this test"
    );
    drop(enabling);
}

#[test]
fn verity_files_are_read_only_but_names_and_metadata_change() {
    let m = Mount::new();
    let data = verity_file(&m, "v", 100_000);
    let v = m.path("v");
    let expected = measure(&v);

    for (what, options) in [
        ("O_RDWR", OpenOptions::new().read(true).write(true).clone()),
        ("O_WRONLY", OpenOptions::new().write(true).clone()),
        ("O_WRONLY|O_APPEND", OpenOptions::new().append(true).clone()),
        (
            "O_WRONLY|O_CREAT|O_TRUNC",
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .clone(),
        ),
        (
            "O_RDONLY|O_TRUNC",
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_TRUNC)
                .clone(),
        ),
    ] {
        assert_errno(options.open(&v), libc::EPERM, what);
    }
    let out = run(Command::new("sh")
        .arg("-c")
        .arg("echo x >> \"$1\"")
        .arg("sh")
        .arg(&v));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"),
        "shell append: {out:?}"
    );
    assert_errno(truncate(&v, 1), libc::EPERM, "truncate(2)");
    assert_errno(
        truncate(&v, data.len() as u64),
        libc::EPERM,
        "truncate(2) to the same size",
    );

    // Allowed: rename, link, unlink, chmod, chown, utimes, xattrs (572).
    fs::rename(&v, m.path("w")).unwrap();
    let w = m.path("w");
    fs::hard_link(&w, m.path("x")).unwrap();
    fs::set_permissions(&w, Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&w, Some(NOBODY), Some(NOBODY)).unwrap();
    run_ok(Command::new("touch").args(["-d", "@1234567890"]).arg(&w));
    rustix::fs::setxattr(&w, "user.note", b"n", rustix::fs::XattrFlags::empty()).unwrap();
    rustix::fs::removexattr(&w, "user.note").unwrap();
    fs::remove_file(&w).unwrap();
    let x = m.path("x");
    let md = fs::metadata(&x).unwrap();
    assert_eq!(
        (
            md.mode() & 0o7777,
            md.uid(),
            md.mtime(),
            md.nlink(),
            md.len()
        ),
        (0o600, NOBODY, 1_234_567_890, 1, data.len() as u64)
    );
    assert_eq!(measure(&x), expected);
    assert_eq!(fs::read(&x).unwrap(), data);
    assert_errno(
        OpenOptions::new().write(true).open(&x),
        libc::EPERM,
        "open for writing after rename and link",
    );
}

#[test]
fn measure_errors_and_unsupported_ioctls() {
    let m = Mount::new();
    let plain = write_file(&m, "plain", b"plain");
    assert_fsverity_fails(
        Command::new(FSVERITY).arg("measure").arg(&plain),
        "FS_IOC_MEASURE_VERITY",
        &plain,
        libc::ENODATA,
    );
    assert_errno(
        raw_measure(&plain, 64),
        libc::ENODATA,
        "measure of a plain file",
    );
    fs::create_dir(m.path("dir")).unwrap();
    assert_errno(
        raw_measure(&m.path("dir"), 64),
        libc::ENODATA,
        "measure of a directory",
    );

    verity_file(&m, "v", 10_000);
    let v = m.path("v");
    let sha512 = write_file(&m, "v512", &random_bytes(10_000, 5));
    enable(&sha512, &["--hash-alg=sha512"]);
    let expected = measure(&v);
    assert_errno(raw_measure(&v, 0), libc::EOVERFLOW, "digest_size 0");
    assert_errno(raw_measure(&v, 31), libc::EOVERFLOW, "digest_size 31");
    assert_eq!(raw_measure(&v, 32).unwrap(), expected);
    // Larger than any digest is fine (Eric Biggers: it is a buffer size).
    assert_eq!(raw_measure(&v, 4000).unwrap(), expected);
    assert_errno(
        raw_measure(&sha512, 63),
        libc::EOVERFLOW,
        "sha512, digest_size 63",
    );
    assert_eq!(raw_measure(&sha512, 64).unwrap(), measure(&sha512));

    // No way to answer FS_IOC_READ_VERITY_METADATA through FUSE: ENOTTY.
    for path in [&v, &plain] {
        assert_errno(
            verity_ioctl(&File::open(path).unwrap(), VerityIoctl::ReadMerkleTree),
            libc::ENOTTY,
            "FS_IOC_READ_VERITY_METADATA",
        );
    }
    let out = fsverity([
        OsStr::new("dump_metadata"),
        OsStr::new("merkle_tree"),
        v.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));

    // FS_IOC_GETFLAGS reports FS_VERITY_FL; FS_IOC_SETFLAGS cannot set it,
    // and, as on ext4 (whose `ext4_fileattr_set()` masks off flags users
    // may see but not set), asking to does not fail.
    let flags = |p: &Path| rustix::fs::ioctl_getflags(File::open(p).unwrap()).unwrap();
    assert!(flags(&v).bits() & FS_VERITY_FL != 0);
    let plain_flags = flags(&plain);
    assert!(plain_flags.bits() & FS_VERITY_FL == 0);
    rustix::fs::ioctl_setflags(
        File::open(&plain).unwrap(),
        rustix::fs::IFlags::from_bits_retain(plain_flags.bits() | FS_VERITY_FL),
    )
    .expect("FS_IOC_SETFLAGS with FS_VERITY_FL");
    assert!(flags(&plain).bits() & FS_VERITY_FL == 0);
    assert_errno(raw_measure(&plain, 64), libc::ENODATA, "after SETFLAGS");
}

// ---------------------------------------------------------------------------
// 4. Interrupting an enable
// ---------------------------------------------------------------------------

#[test]
fn interrupted_enable_leaves_the_file_unchanged() {
    let mut m = Mount::new();
    let big = m.path("big");
    File::create(&big).unwrap().set_len(HUGE).unwrap();
    let mut enabling = Spawned::new(
        Command::new(FSVERITY)
            .arg("enable")
            .arg(&big)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    thread::sleep(Duration::from_millis(500));
    assert!(
        enabling.0.try_wait().unwrap().is_none(),
        "the enable finished within 0.5 s: the file is too small for this test"
    );
    rustix::process::kill_process(enabling.pid(), Signal::TERM).unwrap();
    let killed = Instant::now();
    let status = wait_for(&mut enabling.0, Duration::from_secs(5))
        .expect("fsverity enable did not exit within 5 s of SIGTERM");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    assert!(killed.elapsed() < Duration::from_secs(5));

    let check = |m: &Mount, when: &str| {
        assert_errno(raw_measure(&m.path("big"), 64), libc::ENODATA, when);
        assert_eq!(fs::metadata(m.path("big")).unwrap().len(), HUGE, "{when}");
        assert_eq!(
            fs::metadata(m.backing("big")).unwrap().len(),
            HUGE,
            "{when}"
        );
        assert_no_private_xattrs(&m.backing("big"));
        assert!(!lsattr(&m.path("big")).contains('V'), "{when}");
    };
    check(&m, "right after the kill");
    // A fresh daemon and lookup find the same.
    m.remount(&[]);
    check(&m, "after a remount");
    // And the file can be written again.
    OpenOptions::new()
        .write(true)
        .open(&big)
        .unwrap()
        .write_all(b"x")
        .unwrap();
}

#[test]
fn enable_cut_short_by_a_daemon_crash_is_undone_on_lookup() {
    let mut m = Mount::new();
    let enabling = start_huge_enable(&m, "big");
    // Let some of the tree reach the backing file, then crash.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::metadata(m.backing("big")).unwrap().len() <= HUGE {
        assert!(Instant::now() < deadline, "no tree block was ever written");
        thread::sleep(Duration::from_millis(10));
    }
    m.kill_daemon();
    drop(enabling);
    assert!(get_xattr(&m.backing("big"), ENABLING_XATTR).is_ok());
    m.start(&[]);
    // The first lookup finds the enabling record and rolls the file back.
    assert_eq!(fs::metadata(m.path("big")).unwrap().len(), HUGE);
    assert_eq!(fs::metadata(m.backing("big")).unwrap().len(), HUGE);
    assert_no_private_xattrs(&m.backing("big"));
    assert_errno(
        raw_measure(&m.path("big"), 64),
        libc::ENODATA,
        "after recovery",
    );
}

// ---------------------------------------------------------------------------
// 5. Corruption
// ---------------------------------------------------------------------------

#[test]
fn corrupted_data_block_fails_its_reads_only() {
    let m = Mount::new();
    let data = verity_file(&m, "v", 100_000);
    let v = m.path("v");
    assert_eq!(fs::read(&v).unwrap(), data);
    let bad_block = 10u64;
    let zapped = bad_block * 4096 + 1234;
    flip_byte(&m.backing("v"), zapped);
    drop_caches();

    let file = File::open(&v).unwrap();
    let read = |offset: u64, len: usize| {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset).map(|()| buf)
    };
    // The blocks around it read fine, in any order.
    let after = (bad_block + 1) * 4096;
    assert_eq!(
        read(after, data.len() - after as usize).unwrap(),
        &data[after as usize..]
    );
    assert_eq!(read(0, 4096 * 10).unwrap(), &data[..4096 * 10]);
    // Any read touching the bad block fails.
    assert_errno(read(zapped, 1), libc::EIO, "1-byte read of the zapped byte");
    assert_errno(
        read(bad_block * 4096, 4096),
        libc::EIO,
        "read of the bad block",
    );
    assert_errno(read(0, data.len()), libc::EIO, "read of the whole file");
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&v)
        .unwrap();
    let mut buf = vec![0u8; 4096];
    assert_errno(
        direct.read_exact_at(&mut buf, bad_block * 4096),
        libc::EIO,
        "O_DIRECT read of the bad block",
    );
    let cat = run(Command::new("cat").arg(&v));
    assert!(!cat.status.success());
    assert!(
        String::from_utf8_lossy(&cat.stderr).contains("Input/output error"),
        "cat: {cat:?}"
    );
    let dd = run(Command::new("dd").arg(format!("if={}", v.display())).args([
        "bs=1",
        &format!("skip={zapped}"),
        "count=1",
        "of=/dev/null",
    ]));
    assert!(!dd.status.success(), "dd bs=1: {dd:?}");

    // mmap: the good page reads, the bad one raises SIGBUS.
    let mapped = run(Command::new("python3")
        .args([
            "-c",
            "import mmap, sys\n\
             f = open(sys.argv[1], 'rb')\n\
             m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n\
             for off in sys.argv[2:]:\n\
             \x20   print(off, m[int(off)], flush=True)\n",
        ])
        .arg(&v)
        .arg("5")
        .arg(zapped.to_string()));
    assert_eq!(
        mapped.status.signal(),
        Some(libc::SIGBUS),
        "mmap read: {mapped:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&mapped.stdout),
        format!("5 {}\n", data[5])
    );
}

#[test]
fn corrupted_tree_block_fails_every_read() {
    let mut m = Mount::new();
    let data = verity_file(&m, "v", 100_000);
    // Holes are verified too: an all-hole file of 256 blocks (two levels).
    for path in [m.path("sparse"), m.scratch("sparse")] {
        File::create(path).unwrap().set_len(1 << 20).unwrap();
    }
    enable(&m.path("sparse"), &[]);
    // The tree starts at the first 64 KiB boundary past the data, top level
    // first: its first block covers the whole file. Corrupt it with a fresh
    // daemon (no cached tree blocks) and an empty page cache.
    m.unmount();
    flip_byte(&m.backing("v"), tree_position(data.len()) + 100);
    flip_byte(&m.backing("sparse"), tree_position(1 << 20) + 100);
    drop_caches();
    m.start(&[]);
    for (name, size) in [("v", data.len()), ("sparse", 1 << 20)] {
        let path = m.path(name);
        let file = File::open(&path).unwrap();
        for (offset, len) in [(0, 1), (0, 4096), (50_000, 10), (size - 1, 1), (0, size)] {
            let mut buf = vec![0u8; len];
            assert_errno(
                file.read_exact_at(&mut buf, offset as u64),
                libc::EIO,
                &format!("{name}: read of {len} bytes at {offset}"),
            );
        }
        let cat = run(Command::new("cat").arg(&path));
        assert!(!cat.status.success(), "cat {name}: {cat:?}");
        // Still verity, with its digest (the descriptor is intact).
        assert_eq!(measure(&path), digest(&m.scratch(name), &[]));
    }
}

/// Where the layout puts the Merkle tree of a file of `size` bytes.
fn tree_position(size: usize) -> u64 {
    (size as u64).next_multiple_of(TREE_ALIGNMENT)
}

#[test]
fn corrupted_descriptor_fails_open_and_corrupted_root_hash_fails_reads() {
    let mut m = Mount::new();
    let data = verity_file(&m, "version", 100_000);
    verity_file(&m, "root", 100_000);
    let original = measure(&m.path("root"));
    // 25 blocks: a one-block tree (4096 bytes), then the descriptor:
    // version at byte 0, root hash from byte 16.
    let descriptor = tree_position(data.len()) + 4096;
    m.unmount();
    flip_byte(&m.backing("version"), descriptor);
    flip_byte(&m.backing("root"), descriptor + 16);
    drop_caches();
    m.start(&[]);
    assert_errno(
        File::open(m.path("version")),
        libc::EINVAL,
        "open with a corrupt descriptor",
    );
    let root = File::open(m.path("root")).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_errno(
        root.read_exact_at(&mut buf, 0),
        libc::EIO,
        "read with a wrong root hash",
    );
    assert_ne!(measure(&m.path("root")), original);
}

#[test]
fn every_block_is_verified_for_each_block_size() {
    // O_DIRECT reads reach the daemon with exactly the blocks asked for.
    let m = Mount::new();
    let read = |file: &File, offset: usize, len: usize| {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset as u64).map(|()| buf)
    };
    for bs in [1024usize, 4096, 16384, 65536] {
        for blocks in 1..=4 {
            // Odd counts end with a partial block.
            let size = bs * blocks - (blocks % 2) * 100;
            let name = format!("bs{bs}-{blocks}");
            let data = random_bytes(size, (bs + blocks) as u64);
            let path = write_file(&m, &name, &data);
            enable(&path, &[&format!("--block-size={bs}")]);
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .unwrap();
            let block = |i: usize| (i * bs, bs.min(size - i * bs));
            for bad in 0..blocks {
                let zapped = (bad * bs + bs / 3).min(size - 1);
                flip_byte(&m.backing(&name), zapped as u64);
                for i in 0..blocks {
                    let (offset, len) = block(i);
                    let what = format!("{name}: block {i} with block {bad} corrupt");
                    if i == bad {
                        assert_errno(read(&file, offset, len), libc::EIO, &what);
                    } else {
                        let got =
                            read(&file, offset, len).unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert!(got == data[offset..offset + len], "{what}: wrong data");
                    }
                }
                assert_errno(
                    read(&file, 0, size),
                    libc::EIO,
                    &format!("{name}: whole file with block {bad} corrupt"),
                );
                flip_byte(&m.backing(&name), zapped as u64);
            }
            assert!(read(&file, 0, size).unwrap() == data, "{name}: repaired");
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Unmounting
// ---------------------------------------------------------------------------

/// Signals the daemon with `signal` and checks it unmounts and exits 0.
fn unmounts_cleanly_on(signal: Signal) {
    let mut m = Mount::new();
    fs::write(m.path("f"), b"kept").unwrap();
    rustix::process::kill_process(m.daemon_pid(), signal).unwrap();
    let status = m.wait_daemon();
    assert_eq!(status.code(), Some(0), "{status}:\n{}", m.log());
    assert_eq!(fs::read(m.backing("f")).unwrap(), b"kept");
}

#[test]
fn sigterm_unmounts_cleanly() {
    unmounts_cleanly_on(Signal::TERM);
}

#[test]
fn sigint_unmounts_cleanly() {
    unmounts_cleanly_on(Signal::INT);
}

#[test]
fn a_signal_detaches_a_busy_mount_and_the_daemon_exits_after_the_last_close() {
    let mut m = Mount::new();
    fs::write(m.path("f"), b"kept").unwrap();
    let open = File::open(m.path("f")).unwrap();
    rustix::process::kill_process(m.daemon_pid(), Signal::INT).unwrap();
    // Busy: retried for a while, then detached.
    let start = Instant::now();
    while is_mounted(&m.mnt) {
        assert!(
            start.elapsed() < EXIT_TIMEOUT,
            "still mounted:\n{}",
            m.log()
        );
        thread::sleep(Duration::from_millis(50));
    }
    assert!(m.daemon_exited().is_none(), "exited with a file open");
    // The open file is still served, verified as ever.
    let mut read = String::new();
    (&open).read_to_string(&mut read).unwrap();
    assert_eq!(read, "kept");
    drop(open);
    let status = m.wait_daemon();
    assert_eq!(status.code(), Some(0), "{status}:\n{}", m.log());
}

#[test]
fn an_unmount_of_a_mount_moved_away_leaves_what_is_now_at_its_old_name() {
    let mut m = Mount::new();
    // The directory holding the mount point moves, and another mount
    // takes the old name; then the administrator unmounts ours where it is.
    let root = m.mnt.parent().unwrap().to_path_buf();
    let moved = root.with_extension("moved");
    fs::rename(&root, &moved).unwrap();
    fs::create_dir_all(&m.mnt).unwrap();
    let tmpfs = Command::new("mount")
        .args(["-t", "tmpfs", "victim"])
        .arg(&m.mnt)
        .status();
    assert!(tmpfs.unwrap().success(), "mounting a tmpfs");
    let moved_mnt = moved.join(m.mnt.file_name().unwrap());
    run_ok(Command::new("umount").arg(&moved_mnt));
    // The daemon ends its session: it must not unmount by the old name.
    thread::sleep(Duration::from_secs(1));
    assert!(
        is_mounted(&m.mnt),
        "the mount at the old name was unmounted"
    );
    run_ok(Command::new("umount").arg(&m.mnt));
    fs::remove_dir_all(&root).unwrap();
    fs::rename(&moved, &root).unwrap();
    let status = m.wait_daemon();
    assert_eq!(status.code(), Some(0), "{status}:\n{}", m.log());
}

#[test]
fn external_umount_ends_the_daemon() {
    let mut m = Mount::new();
    fs::write(m.path("f"), b"kept").unwrap();
    m.unmount();
    assert_eq!(fs::read(m.backing("f")).unwrap(), b"kept");
}
