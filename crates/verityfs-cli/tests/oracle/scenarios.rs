//! The behavioural scenarios: every enable/measure rule of fs-verity in
//! the kernel's order, file descriptors and permissions, concurrent and
//! interrupted enables, all tree parameters on files of 0 bytes to three
//! tree levels, the metadata the kernel returns, and corruption. Each
//! records a one-line result per step; the same run on ext4 under Linux
//! and on a verityfs mount must record the same (see `known`).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{
    command_outcome, errno_name, fingerprint, open_outcome, outcome, read_all, read_at, Backend,
    Records,
};
use crate::common::*;

/// File sizes of the parameter matrix: empty, one partial block, block
/// boundaries, one and two tree levels, and three levels with 1 KiB blocks.
const SIZES: [usize; 9] = [0, 1, 4095, 4096, 4097, 65536, 100_000, 600_000, 2_100_000];
/// Merkle tree block sizes: those ext4 with 4 KiB blocks takes and more.
const BLOCK_SIZES: [u32; 5] = [1024, 2048, 4096, 8192, 65536];
/// The size of the file whose enable is interrupted (sparse): long enough
/// to still run when the test looks.
const BUSY_SIZE: u64 = 4 << 30;
/// `STATX_ATTR_VERITY`.
const STATX_ATTR_VERITY: u64 = 0x0010_0000;

/// One run of the scenarios on a backend.
pub struct Run<'a> {
    backend: &'a Backend,
    dir: PathBuf,
    /// This test program, for what must run in another process.
    exe: PathBuf,
    pub records: Records,
}

/// A group of scenarios, by name.
type Group<'a> = (&'static str, fn(&mut Run<'a>));

/// Runs every scenario on `backend`; returns what they recorded.
pub fn run_all<'a>(backend: &'a Backend) -> Records {
    let dir = backend.dir().join("scenarios");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
    let mut run = Run {
        backend,
        dir,
        exe: std::env::current_exe().unwrap(),
        records: Records::default(),
    };
    let groups: [Group<'a>; 10] = [
        ("enable arguments", Run::enable_arguments),
        ("file descriptors", Run::file_descriptors),
        ("permissions", Run::permissions),
        ("read-only bind mount", Run::read_only_bind_mount),
        ("after enable", Run::after_enable),
        ("measure buffers", Run::measure_buffers),
        (
            "concurrent and interrupted enables",
            Run::concurrent_and_interrupted,
        ),
        ("tree parameters and metadata", Run::parameters),
        ("FS_IOC_READ_VERITY_METADATA", Run::metadata_ioctl),
        ("corruption", Run::corruption),
    ];
    for (what, group) in groups {
        let started = Instant::now();
        group(&mut run);
        eprintln!("  {what}: {:.1?}", started.elapsed());
    }
    run.records.merge(super::hostile::run(&run.dir));
    run.records
}

/// Whatever the file, an enable argument with `change` applied.
fn arg_with(change: impl FnOnce(&mut EnableArg)) -> EnableArg {
    let mut arg = EnableArg::default();
    change(&mut arg);
    arg
}

/// A stable seed per file name, so both runs write the same bytes.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `FS_IOC_ENABLE_VERITY` with `arg` on `file`.
pub fn enable_on(file: &File, arg: &EnableArg) -> String {
    outcome(verity_ioctl(file, VerityIoctl::Enable(arg)))
}

/// `FS_IOC_MEASURE_VERITY` with room for `digest_size` bytes: `ok` and
/// the digest, or the errno.
pub fn measure_on(path: &Path, digest_size: u16) -> String {
    let result =
        File::open(path).and_then(|f| verity_ioctl(&f, VerityIoctl::Measure { digest_size }));
    match result {
        Ok(out) => format!("ok {}", format_digest(&out).unwrap_or_default()),
        Err(e) => outcome::<()>(Err(e)),
    }
}

impl Run<'_> {
    fn add(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.records.add(name, value);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A file `name` of `size` bytes (the same on every run).
    fn plain(&self, name: &str, size: usize) -> PathBuf {
        let path = self.path(name);
        fs::write(&path, random_bytes(size, seed_of(name))).unwrap();
        path
    }

    /// `FS_IOC_ENABLE_VERITY` with `arg` on `path` opened read-only.
    fn enable(&self, path: &Path, arg: &EnableArg) -> String {
        match File::open(path) {
            Ok(file) => enable_on(&file, arg),
            Err(e) => format!("open: {}", outcome::<()>(Err(e))),
        }
    }

    /// A verity file `name` of `size` bytes with default parameters.
    fn verity(&self, name: &str, size: usize) -> PathBuf {
        let path = self.plain(name, size);
        let result = self.enable(&path, &EnableArg::default());
        assert_eq!(result, "ok", "enabling {path:?}");
        path
    }

    // -----------------------------------------------------------------------
    // The enable argument, on each kind of file
    // -----------------------------------------------------------------------

    fn enable_arguments(&mut self) {
        let fixed: Vec<(&str, EnableArg)> = vec![
            ("version-0", arg_with(|a| a.version = 0)),
            ("version-2", arg_with(|a| a.version = 2)),
            ("reserved1", arg_with(|a| a.reserved1 = 1)),
            ("reserved2-first", arg_with(|a| a.reserved2[0] = 1)),
            ("reserved2-last", arg_with(|a| a.reserved2[10] = 1 << 63)),
            ("hash-0", arg_with(|a| a.hash_algorithm = 0)),
            ("hash-3", arg_with(|a| a.hash_algorithm = 3)),
            ("hash-257", arg_with(|a| a.hash_algorithm = 257)),
            ("salt-33", arg_with(|a| a.salt = vec![7; 33])),
            (
                "sig-16129",
                arg_with(|a| a.sig = vec![7; MAX_SIGNATURE_SIZE + 1]),
            ),
            (
                "version-2+salt-33",
                arg_with(|a| {
                    a.version = 2;
                    a.salt = vec![7; 33];
                }),
            ),
            (
                "salt-33+hash-257",
                arg_with(|a| {
                    a.salt = vec![7; 33];
                    a.hash_algorithm = 257;
                }),
            ),
            (
                "salt-33+sig-16129",
                arg_with(|a| {
                    a.salt = vec![7; 33];
                    a.sig = vec![7; MAX_SIGNATURE_SIZE + 1];
                }),
            ),
            (
                "block-size-3+sig-16129",
                arg_with(|a| {
                    a.block_size = 3;
                    a.sig = vec![7; MAX_SIGNATURE_SIZE + 1];
                }),
            ),
            (
                "hash-257+block-size-3",
                arg_with(|a| {
                    a.hash_algorithm = 257;
                    a.block_size = 3;
                }),
            ),
            (
                "hash-257+block-size-512",
                arg_with(|a| {
                    a.hash_algorithm = 257;
                    a.block_size = 512;
                }),
            ),
        ];
        let mut cases: Vec<(String, EnableArg)> =
            fixed.into_iter().map(|(n, a)| (n.to_owned(), a)).collect();
        for bs in [0, 1, 3, 512, 4095, 4097, 1 << 17, 1 << 31] {
            cases.push((format!("block-size-{bs}"), arg_with(|a| a.block_size = bs)));
        }
        let plain = self.plain("args-plain", 10_000);
        let verity = self.verity("args-verity", 10_000);
        let dir = self.path("args-dir");
        fs::create_dir(&dir).unwrap();
        for (kind, path) in [("plain", &plain), ("verity", &verity), ("dir", &dir)] {
            let file = File::open(path).unwrap();
            for (name, arg) in &cases {
                self.add(format!("enable-arg/{kind}/{name}"), enable_on(&file, arg));
            }
        }
        let valid = EnableArg::default();
        self.add("enable-arg/verity/valid", self.enable(&verity, &valid));
        self.add("enable-arg/dir/valid", self.enable(&dir, &valid));
        // A signature that is not PKCS#7, on a file of its own (it could
        // be accepted).
        let garbage = self.plain("args-garbage-sig", 10_000);
        let arg = arg_with(|a| a.sig = vec![0x30; 100]);
        self.add(
            "enable-arg/plain/garbage-signature",
            self.enable(&garbage, &arg),
        );
        self.add(
            "enable-arg/plain/garbage-signature-measure",
            measure_on(&garbage, 64),
        );
        self.add(
            "enable-arg/plain/after-failures",
            self.enable(&plain, &valid),
        );
    }

    // -----------------------------------------------------------------------
    // File descriptors, writers, file types
    // -----------------------------------------------------------------------

    fn file_descriptors(&mut self) {
        let valid = EnableArg::default();
        let path = self.plain("fds", 10_000);
        let write_only = OpenOptions::new().write(true).open(&path).unwrap();
        self.add("fd/write-only", enable_on(&write_only, &valid));
        drop(write_only);
        let mode3 = rustix::fs::open(
            &path,
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::WRONLY,
            rustix::fs::Mode::empty(),
        );
        let result = mode3.map_or_else(
            |e| format!("open: {}", errno_name(e.raw_os_error())),
            |fd| enable_on(&File::from(fd), &valid),
        );
        self.add("fd/access-mode-3", result);
        let read_write = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        self.add("fd/read-write", enable_on(&read_write, &valid));
        self.add("fd/other-writer", self.enable(&path, &valid));
        drop(read_write);
        let appender = OpenOptions::new().append(true).open(&path).unwrap();
        self.add("fd/other-appender", self.enable(&path, &valid));
        drop(appender);
        self.add("fd/writable-mapping", self.with_writable_mapping(&path));
        self.add("fd/no-writers-left", self.enable(&path, &valid));
        self.add("fd/no-writers-left-measure", measure_on(&path, 64));

        let fifo = self.path("fifo");
        run_ok(Command::new("mkfifo").arg(&fifo));
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        self.add("fd/fifo", enable_on(&reader, &valid));
    }

    /// Enables `path` while another process has it mapped shared and
    /// writable, its descriptor closed.
    fn with_writable_mapping(&self, path: &Path) -> String {
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
                .arg(path)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        );
        let mut line = String::new();
        BufReader::new(mapper.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "mapped\n");
        let result = self.enable(path, &EnableArg::default());
        drop(mapper.0.stdin.take());
        wait_for(&mut mapper.0, EXIT_TIMEOUT).expect("python exits");
        result
    }

    // -----------------------------------------------------------------------
    // Permissions and inode flags
    // -----------------------------------------------------------------------

    fn permissions(&mut self) {
        let valid = EnableArg::default();
        for (flag, name) in [("+a", "append-only"), ("+i", "immutable")] {
            let path = self.plain(name, 10_000);
            run_ok(Command::new("chattr").arg(flag).arg(&path));
            self.add(format!("perm/{name}"), self.enable(&path, &valid));
            let undo = flag.replace('+', "-");
            run_ok(Command::new("chattr").arg(undo).arg(&path));
            self.add(format!("perm/{name}-cleared"), self.enable(&path, &valid));
        }
        // As user nobody, with the real fsverity program.
        for (name, mode, owner) in [
            ("nobody-root-0444", 0o444, 0),
            ("nobody-root-0666", 0o666, 0),
            ("nobody-own-0444", 0o444, NOBODY),
            ("nobody-own-0644", 0o644, NOBODY),
        ] {
            let path = self.plain(name, 10_000);
            std::os::unix::fs::chown(&path, Some(owner), Some(owner)).unwrap();
            fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
            let result = command_outcome(as_nobody().arg("enable").arg(&path), &path);
            self.add(format!("perm/{name}-enable"), result);
            fs::set_permissions(&path, Permissions::from_mode(0o444)).unwrap();
            let result = command_outcome(as_nobody().arg("measure").arg(&path), &path);
            self.add(format!("perm/{name}-measure"), result);
        }
    }

    /// Enables through a read-only bind mount of the directory.
    fn read_only_bind_mount(&mut self) {
        let path = self.plain("ro", 10_000);
        let view = tempfile::tempdir().unwrap();
        let ro = view.path();
        run_ok(Command::new("mount").arg("--bind").arg(&self.dir).arg(ro));
        let remounted = run(Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(ro));
        let ro_path = ro.join("ro");
        if remounted.status.success() {
            self.add(
                "ro-bind/enable",
                self.enable(&ro_path, &EnableArg::default()),
            );
            let write = OpenOptions::new().write(true).clone();
            self.add("ro-bind/open-for-write", open_outcome(&ro_path, &write));
            self.add("ro-bind/measure", measure_on(&ro_path, 64));
        }
        self.add("ro-bind/remount", format!("{}", remounted.status));
        run_ok(Command::new("umount").arg(ro));
        self.add("ro-bind/measure-writable", measure_on(&path, 64));
    }

    // -----------------------------------------------------------------------
    // A verity file
    // -----------------------------------------------------------------------

    fn after_enable(&mut self) {
        let path = self.verity("after", 100_000);
        let rw = OpenOptions::new().read(true).write(true).clone();
        self.add("after/open-read-write", open_outcome(&path, &rw));
        let append = OpenOptions::new().append(true).clone();
        self.add("after/open-append", open_outcome(&path, &append));
        let trunc = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .clone();
        self.add("after/open-create-truncate", open_outcome(&path, &trunc));
        self.add(
            "after/truncate",
            command_outcome(Command::new("truncate").args(["-s", "0"]).arg(&path), &path),
        );
        self.add("after/contents", read_all(&path));
        self.add(
            "after/enable-again",
            self.enable(&path, &EnableArg::default()),
        );
        let flags = run_ok(Command::new("lsattr").arg(&path));
        let verity_flag = flags.split_whitespace().next().unwrap_or("").contains('V');
        self.add("after/lsattr-verity-flag", verity_flag.to_string());
        let statx = rustix::fs::statx(
            rustix::fs::CWD,
            &path,
            rustix::fs::AtFlags::empty(),
            rustix::fs::StatxFlags::BASIC_STATS,
        )
        .unwrap();
        let verity = rustix::fs::StatxAttributes::from_bits_retain(STATX_ATTR_VERITY);
        let attr = (
            statx.stx_attributes.contains(verity),
            statx.stx_attributes_mask.contains(verity),
        );
        self.add("after/statx-attr-verity", format!("{attr:?}"));
        let chmod = fs::set_permissions(&path, Permissions::from_mode(0o600));
        self.add("after/chmod", outcome(chmod));
        let xattr =
            rustix::fs::setxattr(&path, "user.oracle", b"1", rustix::fs::XattrFlags::empty());
        self.add(
            "after/setxattr",
            outcome(xattr.map_err(std::io::Error::from)),
        );
        let moved = self.path("after-moved");
        self.add("after/rename", outcome(fs::rename(&path, &moved)));
        let link = self.path("after-link");
        self.add("after/link", outcome(fs::hard_link(&moved, &link)));
        self.add("after/link-measure", measure_on(&link, 64));
        self.add("after/unlink", outcome(fs::remove_file(&link)));
        self.add("after/measure", measure_on(&moved, 64));
    }

    fn measure_buffers(&mut self) {
        let plain = self.plain("measure-plain", 1000);
        self.add("measure/plain", measure_on(&plain, 64));
        let dir = self.path("measure-dir");
        fs::create_dir(&dir).unwrap();
        let on_dir = File::open(&dir)
            .and_then(|f| verity_ioctl(&f, VerityIoctl::Measure { digest_size: 64 }));
        self.add("measure/dir", outcome(on_dir));
        let sha256 = self.verity("measure-sha256", 5000);
        let sha512 = self.path("measure-sha512");
        fs::write(&sha512, random_bytes(5000, 512)).unwrap();
        let arg = arg_with(|a| a.hash_algorithm = 2);
        assert_eq!(self.enable(&sha512, &arg), "ok");
        for size in [0, 1, 31, 32, 64] {
            self.add(
                format!("measure/sha256-room-{size}"),
                measure_on(&sha256, size),
            );
        }
        for size in [32, 63, 64, 65535] {
            self.add(
                format!("measure/sha512-room-{size}"),
                measure_on(&sha512, size),
            );
        }
    }

    // -----------------------------------------------------------------------
    // A second enable while one runs, writers meanwhile, killing it
    // -----------------------------------------------------------------------

    fn concurrent_and_interrupted(&mut self) {
        let path = self.path("busy");
        // Written just before (a release may still be on its way).
        File::create(&path).unwrap().set_len(BUSY_SIZE).unwrap();
        let mut first = Spawned::new(
            Command::new(&self.exe)
                .arg("--oracle-enable")
                .arg(&path)
                .stdout(Stdio::piped()),
        );
        let mut line = String::new();
        BufReader::new(first.0.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "enabling\n");
        thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        let second = self.enable(&path, &EnableArg::default());
        let took = started.elapsed();
        self.add("busy/second-enable", second);
        let speed = if took < Duration::from_millis(500) {
            "at once"
        } else {
            "slowly"
        };
        self.add("busy/second-enable-answered", speed);
        self.add("busy/measure-meanwhile", measure_on(&path, 64));
        let write = OpenOptions::new().write(true).clone();
        self.add("busy/open-for-write-meanwhile", open_outcome(&path, &write));
        self.add("busy/read-meanwhile", read_at(&path, 0, 4096));
        self.add(
            "busy/first-still-running",
            first.0.try_wait().unwrap().is_none().to_string(),
        );
        let killed = Instant::now();
        first.0.kill().unwrap();
        let status = wait_for(&mut first.0, Duration::from_secs(30)).expect("the enable ends");
        let quick = if killed.elapsed() < Duration::from_secs(5) {
            "within 5 s"
        } else {
            "after 5 s"
        };
        self.add("busy/killed-enable", format!("{status}, {quick}"));
        self.add("busy/measure-after-kill", measure_on(&path, 64));
        self.add(
            "busy/size-after-kill",
            fs::metadata(&path).unwrap().len().to_string(),
        );
        let write = OpenOptions::new().write(true).clone();
        self.add(
            "busy/open-for-write-after-kill",
            open_outcome(&path, &write),
        );
    }

    // -----------------------------------------------------------------------
    // Tree parameters and the metadata
    // -----------------------------------------------------------------------

    fn parameters(&mut self) {
        let mut combos = Vec::new();
        for alg in [1u32, 2] {
            for bs in BLOCK_SIZES {
                // Every size with the usual block sizes, a few with the
                // others; three tree levels need 1 KiB blocks.
                let sizes: &[usize] = match bs {
                    1024 => &SIZES,
                    4096 => &SIZES[..SIZES.len() - 1],
                    _ => &[0, 4097, 100_000],
                };
                for &size in sizes {
                    combos.push((alg, bs, Vec::new(), size));
                }
            }
            for bs in [1024, 4096] {
                for salt in [vec![1u8], (0..32).collect::<Vec<u8>>()] {
                    combos.push((alg, bs, salt, 100_000));
                }
            }
        }
        for (alg, bs, salt, size) in combos {
            let alg_name = if alg == 1 { "sha256" } else { "sha512" };
            let tag = format!("{alg_name}-bs{bs}-salt{}-size{size}", salt.len());
            let path = self.path(&format!("p-{tag}"));
            let data = random_bytes(size, seed_of(&tag));
            fs::write(&path, &data).unwrap();
            let arg = arg_with(|a| {
                a.hash_algorithm = alg;
                a.block_size = bs;
                a.salt = salt.clone();
            });
            let enabled = self.enable(&path, &arg);
            if enabled != "ok" {
                self.add(format!("params/{tag}"), enabled);
                continue;
            }
            let expected = format!("ok {}", digest_of(&data, alg, bs, &salt));
            let measured = measure_on(&path, 64);
            let agrees = if measured == expected {
                "the library's"
            } else {
                "NOT the library's"
            };
            self.add(format!("params/{tag}"), format!("ok, {measured}, {agrees}"));
            let contents = match fs::read(&path) {
                Ok(read) if read == data => "ok, read back".to_owned(),
                Ok(read) => format!("DIFFERENT: {}", fingerprint(&read)),
                Err(e) => outcome::<()>(Err(e)),
            };
            self.add(format!("params/{tag}/contents"), contents);
            self.metadata(&tag, &path, &data, &arg);
        }
    }

    /// The Merkle tree, descriptor and signature the filesystem returns for
    /// `path`, compared byte for byte with what the library and `verityfs
    /// digest` build.
    fn metadata(&mut self, tag: &str, path: &Path, data: &[u8], arg: &EnableArg) {
        let alg = verityfs::HashAlgorithm::from_id(arg.hash_algorithm).unwrap();
        let params =
            verityfs::MerkleTreeParams::new(alg, arg.block_size.into(), &arg.salt).unwrap();
        let (descriptor, tree) =
            verityfs::build_merkle_tree(&params, data.len() as u64, data, Vec::new(), &mut |_| {
                Ok(())
            })
            .unwrap();
        // The CLI builds the same bytes as the library: checked here, not
        // again in the VM, where starting programs is slow.
        if std::env::var_os("VERITYFS_ORACLE").is_none() {
            let (cli_tree, cli_descriptor) = cli_digest_outputs(data, arg);
            assert!(
                cli_tree == tree,
                "{tag}: verityfs digest --out-merkle-tree differs"
            );
            let descriptor_bytes = descriptor.to_bytes();
            assert!(
                cli_descriptor == descriptor_bytes,
                "{tag}: verityfs digest --out-descriptor differs"
            );
        }
        let reader = MetadataReader::new(self.backend, path);
        for (kind, expected, chunk) in [
            (1, &tree[..], 32768),
            (1, &tree[..], 997),
            (2, &descriptor.to_bytes()[..], 32768),
            (3, &[][..], 32768),
        ] {
            let name = ["", "merkle-tree", "descriptor", "signature"][kind as usize];
            let value = match reader.read_all(kind, chunk) {
                Ok(got) if got == expected => {
                    format!(
                        "{} bytes, identical to the library's and verityfs digest's",
                        got.len()
                    )
                }
                Ok(got) => format!(
                    "DIFFERENT: {} (expected {})",
                    fingerprint(&got),
                    fingerprint(expected)
                ),
                Err(errno) => errno_name(errno),
            };
            self.add(
                format!("params/{tag}/metadata-{name}-in-{chunk}-byte-reads"),
                value,
            );
        }
    }

    /// `FS_IOC_READ_VERITY_METADATA` itself, edge cases included (it
    /// cannot pass through FUSE: see `known`).
    fn metadata_ioctl(&mut self) {
        let verity = self.verity("meta-verity", 100_000);
        let plain = self.plain("meta-plain", 100_000);
        let cases: [(&str, &Path, u64, u64, usize, u64); 8] = [
            ("tree-first-4k", &verity, 1, 0, 4096, 0),
            ("descriptor", &verity, 2, 0, 4096, 0),
            ("signature-none", &verity, 3, 0, 4096, 0),
            ("type-4", &verity, 4, 0, 4096, 0),
            ("reserved-set", &verity, 1, 0, 4096, 1),
            ("offset-past-end", &verity, 1, 1 << 20, 4096, 0),
            ("offset-overflow", &verity, 1, u64::MAX - 100, 4096, 0),
            ("not-verity", &plain, 1, 0, 4096, 0),
        ];
        for (name, path, kind, offset, len, reserved) in cases {
            let mut buf = vec![0u8; len];
            let result = File::open(path)
                .and_then(|f| read_verity_metadata(&f, kind, offset, &mut buf, reserved));
            let value = match result {
                Ok(n) => format!("ok {}", fingerprint(&buf[..n])),
                Err(e) => outcome::<()>(Err(e)),
            };
            self.add(format!("metadata-ioctl/{name}"), value);
        }
    }

    // -----------------------------------------------------------------------
    // Corruption
    // -----------------------------------------------------------------------

    fn corruption(&mut self) {
        // (name, size, block size, byte to flip: data or tree_pos + n)
        let tree = |size: u64, n: u64| size.next_multiple_of(65536) + n;
        let cases: [(&str, u64, u32, u64, bool); 5] = [
            ("data-4k", 16384, 4096, 2 * 4096 + 5, false),
            ("data-1k", 8192, 1024, 3 * 1024 + 1, false),
            ("last-partial-block", 10_000, 4096, 9999, false),
            ("tree", 100_000, 4096, tree(100_000, 100), false),
            ("tree-of-sparse", 1 << 20, 4096, tree(1 << 20, 100), true),
        ];
        let mut files = Vec::new();
        for (name, size, bs, pos, sparse) in cases {
            let path = self.path(&format!("corrupt-{name}"));
            if sparse {
                File::create(&path).unwrap().set_len(size).unwrap();
            } else {
                fs::write(&path, random_bytes(size as usize, seed_of(name))).unwrap();
            }
            let arg = arg_with(|a| a.block_size = bs);
            assert_eq!(self.enable(&path, &arg), "ok", "{path:?}");
            files.push((name, path, pos));
        }
        for (_, path, pos) in &files {
            self.backend.corrupt(path, *pos);
        }
        // The pages cached while writing would hide the corruption.
        drop_caches();
        for (name, path, pos) in &files {
            let base = format!("corrupt/{name}");
            self.add(format!("{base}/read-first-4k"), read_at(path, 0, 4096));
            self.add(
                format!("{base}/read-corrupted-byte"),
                read_at(path, *pos, 1),
            );
            self.add(format!("{base}/read-all"), read_all(path));
            self.add(format!("{base}/measure"), measure_on(path, 64));
        }
        let (_, path, pos) = &files[0];
        let mapped = command_outcome(
            Command::new("python3")
                .args([
                    "-c",
                    "import mmap, sys\n\
                     f = open(sys.argv[1], 'rb')\n\
                     m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n\
                     for off in sys.argv[2:]:\n\
                     \x20   print(off, m[int(off)], flush=True)\n",
                ])
                .arg(path)
                .arg("5")
                .arg(pos.to_string()),
            path,
        );
        self.add("corrupt/data-4k/mmap-read", mapped);
    }
}

/// The built-in signature stored with the verity file `path`.
pub fn read_signature(backend: &Backend, path: &Path) -> Result<Vec<u8>, i32> {
    MetadataReader::new(backend, path).read_all(3, 32768)
}

/// `fsverity` run as user nobody.
fn as_nobody() -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", FSVERITY]);
    cmd
}

/// The tree and descriptor `verityfs digest --out-merkle-tree
/// --out-descriptor` writes for `data` with `arg`'s parameters.
fn cli_digest_outputs(data: &[u8], arg: &EnableArg) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let (input, tree, desc) = (
        dir.path().join("in"),
        dir.path().join("tree"),
        dir.path().join("desc"),
    );
    fs::write(&input, data).unwrap();
    let salt: String = arg.salt.iter().map(|b| format!("{b:02x}")).collect();
    run_ok(
        Command::new(VERITYFS)
            .arg("digest")
            .arg(&input)
            .arg(format!("--hash-alg={}", arg.hash_algorithm))
            .arg(format!("--block-size={}", arg.block_size))
            .arg(format!("--salt={salt}"))
            .arg(format!("--out-merkle-tree={}", tree.display()))
            .arg(format!("--out-descriptor={}", desc.display())),
    );
    (fs::read(tree).unwrap(), fs::read(desc).unwrap())
}

/// Reads a verity file's metadata: with `FS_IOC_READ_VERITY_METADATA` on
/// ext4, with the library from the backing file on verityfs (the ioctl
/// cannot pass through FUSE).
enum MetadataReader {
    Kernel(File),
    Library(Box<verityfs::VerityFile>),
}

impl MetadataReader {
    fn new(backend: &Backend, path: &Path) -> MetadataReader {
        match backend {
            Backend::Ext4 { .. } => MetadataReader::Kernel(File::open(path).unwrap()),
            Backend::Verityfs(m) => {
                let backing = m.backing.join(path.strip_prefix(&m.mnt).unwrap());
                let verifier = verityfs::Verifier::new(verityfs::ReadOptions::default());
                let file = File::open(&backing).unwrap();
                let file = verityfs::VerityFile::open(&verifier, file, &backing).unwrap();
                MetadataReader::Library(Box::new(file))
            }
        }
    }

    /// The whole item of `kind` in reads of `chunk` bytes, or the errno.
    fn read_all(&self, kind: u64, chunk: usize) -> Result<Vec<u8>, i32> {
        let mut out = Vec::new();
        loop {
            let bytes = self.read(kind, out.len() as u64, chunk)?;
            if bytes.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&bytes);
        }
    }

    fn read(&self, kind: u64, offset: u64, len: usize) -> Result<Vec<u8>, i32> {
        match self {
            MetadataReader::Kernel(file) => {
                let mut buf = vec![0u8; len];
                let n = read_verity_metadata(file, kind, offset, &mut buf, 0)
                    .map_err(|e| e.raw_os_error().unwrap())?;
                buf.truncate(n);
                Ok(buf)
            }
            MetadataReader::Library(file) => {
                let kind = match kind {
                    1 => verityfs::MetadataType::MerkleTree,
                    2 => verityfs::MetadataType::Descriptor,
                    _ => verityfs::MetadataType::Signature,
                };
                file.read_metadata(kind, offset, len).map_err(|e| e.errno())
            }
        }
    }
}
