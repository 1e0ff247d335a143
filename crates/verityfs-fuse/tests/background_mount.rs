//! Real mounts through the crate's public API: a [`BackgroundMount`] of a
//! temporary backing directory, used with plain file I/O and the raw
//! fs-verity ioctls, and checked against the `verityfs` library.
//!
//! Mounting FUSE needs root and `/dev/fuse`: without them every test fails
//! and says so.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use verityfs::{build_merkle_tree, DiscardTree, HashAlgorithm, MerkleTreeParams};
use verityfs_fuse::{BackgroundMount, MountOptions};

/// `FS_IOC_ENABLE_VERITY`: `_IOW('f', 133, struct fsverity_enable_arg)`.
const FS_IOC_ENABLE_VERITY: libc::c_ulong = 0x4080_6685;
/// `FS_IOC_MEASURE_VERITY`: `_IOWR('f', 134, struct fsverity_digest)`.
const FS_IOC_MEASURE_VERITY: libc::c_ulong = 0xc004_6686;
/// `FS_VERITY_HASH_ALG_SHA256`.
const SHA256: u32 = 1;

/// `struct fsverity_enable_arg` of `<linux/fsverity.h>`.
#[repr(C)]
#[derive(Default)]
struct EnableArg {
    version: u32,
    hash_algorithm: u32,
    block_size: u32,
    salt_size: u32,
    salt_ptr: u64,
    sig_size: u32,
    reserved1: u32,
    sig_ptr: u64,
    reserved2: [u64; 11],
}

/// `struct fsverity_digest` with room for the largest digest (SHA-512).
#[repr(C)]
struct MeasureArg {
    digest_algorithm: u16,
    digest_size: u16,
    digest: [u8; 64],
}

/// The user the unprivileged checks run as (`nobody`).
const NOBODY: u32 = 65534;

/// A temporary backing directory and mountpoint, and the mount of one on
/// the other while there is one, open to other users (`allow_other`).
struct Fixture {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mountpoint: PathBuf,
    mount: Option<BackgroundMount>,
}

impl Fixture {
    /// Mounts a new, empty backing directory.
    fn new() -> Fixture {
        require_root_and_fuse();
        let dir = tempfile::Builder::new()
            .prefix("verityfs-fuse-test")
            .tempdir()
            .unwrap();
        // Other users reach the mountpoint through it.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let (backing, mountpoint) = (dir.path().join("backing"), dir.path().join("mnt"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mountpoint).unwrap();
        let mut fixture = Fixture {
            _dir: dir,
            backing,
            mountpoint,
            mount: None,
        };
        fixture.mount();
        fixture
    }

    fn mount(&mut self) {
        let options = MountOptions {
            allow_other: true,
            ..MountOptions::default()
        };
        let mount = BackgroundMount::spawn(&self.backing, &self.mountpoint, options)
            .expect("mounting the backing directory");
        assert!(is_mounted(&self.mountpoint), "spawn returned unmounted");
        self.mount = Some(mount);
    }

    /// Drops the mount, which must unmount it.
    fn unmount(&mut self) {
        drop(self.mount.take());
        assert!(!is_mounted(&self.mountpoint), "still mounted after drop");
    }

    /// `name` on the mount.
    fn path(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }

    /// `name`'s backing file.
    fn backing(&self, name: &str) -> PathBuf {
        self.backing.join(name)
    }

    /// Writes `data` to a new file `name` through the mount, writable by
    /// everyone, and enables verity on it with SHA-256 and 4096-byte blocks.
    fn verity_file(&self, name: &str, data: &[u8]) {
        self.plain_file(name, data);
        enable(&File::open(self.path(name)).unwrap()).expect("FS_IOC_ENABLE_VERITY");
    }

    /// Writes `data` to a new file `name` through the mount, writable by
    /// everyone.
    fn plain_file(&self, name: &str, data: &[u8]) {
        fs::write(self.path(name), data).unwrap();
        let everyone = fs::Permissions::from_mode(0o666);
        fs::set_permissions(self.path(name), everyone).unwrap();
    }
}

/// Fails the test, saying what is missing, where no FUSE mount can be made.
fn require_root_and_fuse() {
    assert!(
        rustix::process::geteuid().is_root(),
        "these tests mount FUSE filesystems, which needs root: run them as root"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests mount FUSE filesystems, which needs /dev/fuse (modprobe fuse)"
    );
}

/// Whether `path` (canonical) is a mountpoint in `/proc/self/mountinfo`.
fn is_mounted(path: &Path) -> bool {
    let path = fs::canonicalize(path).unwrap();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(path.to_str().unwrap()))
}

/// `FS_IOC_ENABLE_VERITY` on `file` with SHA-256, 4096-byte blocks, no salt
/// and no signature.
fn enable(file: &File) -> io::Result<()> {
    let arg = EnableArg {
        version: 1,
        hash_algorithm: SHA256,
        block_size: 4096,
        ..EnableArg::default()
    };
    // SAFETY: `arg` is a `struct fsverity_enable_arg`, the argument this
    // request reads; its salt and signature are empty, so their null
    // pointers are not followed.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_ENABLE_VERITY as _, &arg) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `FS_IOC_MEASURE_VERITY` on `file`: the hash algorithm number and digest.
fn measure(file: &File) -> io::Result<(u16, Vec<u8>)> {
    let mut arg = MeasureArg {
        digest_algorithm: 0,
        digest_size: 64,
        digest: [0; 64],
    };
    // SAFETY: `arg` is a `struct fsverity_digest` followed by the
    // `digest_size` bytes it announces, all of which the request may write.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_MEASURE_VERITY as _, &mut arg) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let digest = arg.digest[..usize::from(arg.digest_size)].to_vec();
    Ok((arg.digest_algorithm, digest))
}

/// Opens `path` for appending as user `nobody`, in a shell.
fn append_as_nobody(path: &Path) -> Output {
    Command::new("sh")
        .args(["-c", "exec 3>>\"$1\"", "sh"])
        .arg(path)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("running sh as nobody")
}

/// `len` random bytes from a generator seeded with `seed`.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut bytes);
    bytes
}

/// The errno of `result`, which must be an error.
fn errno<T: std::fmt::Debug>(result: io::Result<T>) -> i32 {
    result.unwrap_err().raw_os_error().expect("an OS error")
}

#[test]
fn written_file_enabled_reads_back_and_measures_the_library_digest() {
    let fixture = Fixture::new();
    let data = random_bytes(300_000, 1);
    fixture.verity_file("f", &data);

    let mut file = File::open(fixture.path("f")).unwrap();
    let mut read = Vec::new();
    file.read_to_end(&mut read).unwrap();
    assert!(read == data, "the verity file reads back other bytes");

    let params = MerkleTreeParams::default();
    assert_eq!(params.hash_algorithm(), HashAlgorithm::Sha256);
    let size = data.len() as u64;
    let (descriptor, _) =
        build_merkle_tree(&params, size, &data[..], DiscardTree, &mut |_| Ok(())).unwrap();
    let (alg, digest) = measure(&file).expect("FS_IOC_MEASURE_VERITY");
    assert_eq!(u32::from(alg), SHA256);
    assert_eq!(digest, descriptor.file_digest().as_bytes());
}

#[test]
fn plain_file_has_no_digest_and_verity_file_refuses_writes() {
    let fixture = Fixture::new();
    fixture.plain_file("plain", b"plain");
    let plain = File::open(fixture.path("plain")).unwrap();
    assert_eq!(
        errno(measure(&plain)),
        libc::ENODATA,
        "measuring a plain file"
    );

    fixture.verity_file("v", &random_bytes(10_000, 2));
    let open_for = |options: &mut OpenOptions| options.open(fixture.path("v"));
    let writing = open_for(OpenOptions::new().write(true));
    assert_eq!(errno(writing), libc::EPERM, "opening for writing");
    let truncating = open_for(OpenOptions::new().write(true).truncate(true));
    assert_eq!(errno(truncating), libc::EPERM, "opening with O_TRUNC");
    let file = File::open(fixture.path("v")).unwrap();
    assert_eq!(errno(enable(&file)), libc::EEXIST, "enabling again");
    assert_eq!(fs::read(fixture.path("v")).unwrap().len(), 10_000);
}

#[test]
fn verity_file_refuses_unprivileged_writers_too() {
    let fixture = Fixture::new();
    fixture.plain_file("plain", b"plain");
    fixture.verity_file("v", &random_bytes(10_000, 4));
    // Both files are writable by everyone: only the verity rule refuses.
    let plain = append_as_nobody(&fixture.path("plain"));
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(
        plain.status.success(),
        "nobody cannot open a plain file: {stderr}"
    );
    let verity = append_as_nobody(&fixture.path("v"));
    let stderr = String::from_utf8_lossy(&verity.stderr);
    assert!(
        !verity.status.success(),
        "nobody opened a verity file for writing"
    );
    assert!(
        stderr.contains("Operation not permitted"),
        "not EPERM: {stderr}"
    );
}

#[test]
fn tampered_backing_data_fails_its_reads_with_eio() {
    let mut fixture = Fixture::new();
    let data = random_bytes(100_000, 3);
    fixture.verity_file("v", &data);
    // A new mount: nothing read before the change is cached.
    fixture.unmount();
    let bad_block = 10u64;
    let backing = OpenOptions::new()
        .write(true)
        .open(fixture.backing("v"))
        .unwrap();
    let pos = bad_block * 4096 + 123;
    backing
        .write_all_at(&[!data[pos as usize]], pos)
        .expect("changing a byte of the backing file");
    drop(backing);
    fixture.mount();

    let file = File::open(fixture.path("v")).unwrap();
    let read = |offset: u64, len: usize| {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset).map(|()| buf)
    };
    assert_eq!(errno(read(pos, 1)), libc::EIO, "reading the changed byte");
    assert_eq!(errno(read(0, data.len())), libc::EIO, "reading the file");
    let after = (bad_block + 1) * 4096;
    let rest = read(after, data.len() - after as usize).expect("reading past the bad block");
    assert!(
        rest == data[after as usize..],
        "wrong bytes past the bad block"
    );
}

#[test]
fn dropping_a_busy_mount_detaches_it() {
    let mut fixture = Fixture::new();
    fs::write(fixture.path("kept"), b"kept").unwrap();
    let open = File::open(fixture.path("kept")).unwrap();
    // Busy: retried for a while, then detached; the open file still reads.
    fixture.unmount();
    let mut read = Vec::new();
    (&open).read_to_end(&mut read).unwrap();
    assert_eq!(read, b"kept");
}

/// Unmounts `fixture`'s mount after moving the directory holding its
/// mount point away and mounting a tmpfs at the old name, with a file open
/// in ours and in the tmpfs if `busy`: ours is unmounted where it is now
/// (detached if busy), and the tmpfs stays mounted.
fn unmount_after_the_parent_moved(busy: bool) {
    let mut fixture = Fixture::new();
    fs::write(fixture.path("kept"), b"kept").unwrap();
    let open = busy.then(|| File::open(fixture.path("kept")).unwrap());
    // The directory holding the mount point moves; at the old name, a
    // mount of someone else's.
    let home = fixture._dir.path().to_path_buf();
    let moved = home.with_extension("moved");
    fs::rename(&home, &moved).unwrap();
    fs::create_dir_all(&fixture.mountpoint).unwrap();
    let victim = &fixture.mountpoint;
    let tmpfs = Command::new("mount")
        .args(["-t", "tmpfs", "victim"])
        .arg(victim)
        .status();
    assert!(tmpfs.unwrap().success(), "mounting a tmpfs");
    let victim_busy = busy.then(|| File::create(victim.join("busy")).unwrap());
    let result = fixture.mount.take().unwrap().unmount();
    let moved_mnt = moved.join("mnt");
    let (victim_kept, ours_kept) = (is_mounted(victim), is_mounted(&moved_mnt));
    drop((open, victim_busy));
    for point in [victim, &moved_mnt] {
        Command::new("umount")
            .arg("-l")
            .arg(point)
            .status()
            .unwrap();
    }
    fs::remove_dir_all(&home).unwrap();
    fs::rename(&moved, &home).unwrap();
    assert!(victim_kept, "the mount now at the old name was unmounted");
    result.expect("unmounting the mount where it is now");
    assert!(!ours_kept, "our mount is still mounted");
}

#[test]
fn a_busy_mount_whose_parent_moved_is_unmounted_where_it_is() {
    unmount_after_the_parent_moved(true);
}

#[test]
fn a_mount_whose_parent_moved_is_unmounted_where_it_is() {
    unmount_after_the_parent_moved(false);
}

#[test]
fn dropping_or_unmounting_the_mount_unmounts_it() {
    let mut fixture = Fixture::new();
    fs::write(fixture.path("kept"), b"kept").unwrap();
    fixture.unmount();
    assert_eq!(fs::read(fixture.backing("kept")).unwrap(), b"kept");
    assert!(fs::read_dir(&fixture.mountpoint).unwrap().next().is_none());

    let mount = BackgroundMount::spawn(
        &fixture.backing,
        &fixture.mountpoint,
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(fs::read(fixture.path("kept")).unwrap(), b"kept");
    mount.unmount().expect("unmounting");
    assert!(
        !is_mounted(&fixture.mountpoint),
        "still mounted after unmount"
    );
}
